"""The tool model's structured initialisation (`trainer.models.copy_circuit`), before any training: head 0 of layer 1 is an
induction head that, at the last token of the call's number, attends to the token that followed the same tokens in
the task, and where several places match the last two tokens, to the one whose token before them matches too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trainer.models.copy_circuit import ROPE_THETA, wire_copy_circuit  # noqa: E402
from trainer.models.tiny_model import make_tiny_model  # noqa: E402
from trainer.models.tool_model import tool_model_spec  # noqa: E402


@pytest.fixture(scope="module")
def wired(tmp_path_factory):
    """An untrained `tool_model_spec()` model on the small test vocabulary, the circuit wired, and its tokenizer."""
    model_dir = make_tiny_model(tmp_path_factory.mktemp("circuit") / "model", tool_model_spec(real_vocab=False))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    config._attn_implementation = "eager"  # attention weights out
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    (answer,), (alias,) = ids("answer"), ids(" answer")
    used = sorted(set(range(len(tokenizer))))
    wire_copy_circuit(model, used, digits, aliases=[(answer, alias)], seed=0)
    return model, tokenizer


def _copy_head_attention(model, ids: list[int]):
    """Head 0 of layer 1's attention from the last position, over every position."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return out.attentions[1][0, 0, -1]


def test_the_copy_head_finds_a_one_digit_numbers_end_in_the_task_not_where_another_number_starts_with_it(wired):
    # The call's "answer 2" must end where the task's "answer 2" did ("."), not continue as the date's " 2026"
    # does: both places follow " " and "2", and only the task's has `answer` before them (Claude Code's environment
    # holds the date after the task; the model wrote `answer 2026` for "Submit the answer 2." there).
    model, tokenizer = wired
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    task = ids("Please submit the answer") + ids(" ") + ids("2") + ids(".")
    environment = ids(" Today is") + ids(" ") + ids("2") + ids("0") + ids("2") + ids("6") + ids(" and the")
    call = ids(" ok") + ids("answer") + ids(" ") + ids("2")
    sequence = task + environment + environment + call
    attention = _copy_head_attention(model, sequence)
    after_task = len(task) - 1  # the task's "." (the token after its "2")
    after_dates = [len(task) + k * len(environment) + environment.index(ids("0")[0]) for k in (0, 1)]
    assert int(attention.argmax()) == after_task, attention
    assert all(attention[after_task] > 2 * attention[p] for p in after_dates), attention


def test_the_copy_head_follows_a_longer_number_digit_by_digit(wired):
    model, tokenizer = wired
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    number = [ids(d)[0] for d in "4073"]
    task = ids("Submit the answer") + ids(" ") + number + ids(".") + ids(" Then stop")
    start = len(ids("Submit the answer")) + 1  # the number's first digit in the task
    for written in range(1, len(number) + 1):  # the call has written `answer` and the first `written` digits
        call = ids(" ok") + ids("answer") + ids(" ") + number[:written]
        attention = _copy_head_attention(model, task + call)
        assert int(attention.argmax()) == start + written, (written, attention)  # the next digit, or "." at the end
