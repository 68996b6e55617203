"""`train_tool_calling`: a tiny model trained offline in seconds calls `bash` with `answer N` for numbers and
phrasings it never saw, says "Done." after the tool response, keeps some sampling variance, and trains the same
way twice for a seed. Generation is plain transformers `generate` on the model's own chat template; calls are
parsed with the interceptor's own parser."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from interceptor.parsing import parse_output
from interceptor.protocol import normalize_messages
from trainer.tiny_model import TinyModelSpec, make_tiny_model
from trainer.tool_model import BASH_TOOL, DONE_TEXT, ToolTrainingSpec, tool_model_spec, train_tool_calling

# The agents' captured first requests, shipped with the trainer (the same captures as in tests/data).
REQUESTS = Path(__file__).resolve().parents[2] / "trainer" / "agent_requests"
AGENT_REQUESTS = {name: REQUESTS / f"{name}_first_request.json" for name in ("pi", "opencode")}
# Phrasings and numbers the training episodes never use (training draws from a fixed list of phrasings).
HELD_OUT_TASKS = (
    "Please submit the answer {n} when ready.",
    "Submit the answer {n}, nothing else.",
    "I computed it already: submit the answer {n} via bash.",
    "There are 17 files here. Submit the answer {n}.",
)
READ_TOOL = {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
END = "<|im_end|>"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real-vocabulary tool model, trained once for the module (with the agents' captured prompts when present)."""
    model_dir = make_tiny_model(tmp_path_factory.mktemp("tool") / "model", tool_model_spec(real_vocab=True))
    agents = tuple(path for path in AGENT_REQUESTS.values() if path.is_file())
    report = train_tool_calling(model_dir, ToolTrainingSpec(agent_requests=agents))
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return report, tokenizer, model


def _numbers(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    digits = [rng.choice((1, 2, 3, 4)) for _ in range(count)]
    return [rng.randrange(10 ** (d - 1) if d > 1 else 0, 10**d) for d in digits]


def _prompt(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def _generate(trained, prompts: list[str], *, sample: bool = False, max_new_tokens: int = 40) -> list[str]:
    _, tokenizer, model = trained
    texts = []
    for i in range(0, len(prompts), 8):
        batch = tokenizer(prompts[i:i + 8], return_tensors="pt", padding=True, add_special_tokens=False)
        options = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **options)
        texts += [tokenizer.decode(row, skip_special_tokens=False).replace(tokenizer.pad_token, "")
                  for row in out[:, batch["input_ids"].shape[1]:]]
    return texts


def _submits(text: str, number: int) -> bool:
    """Exactly one bash call with `answer <number>`, nothing else, then the end of the turn."""
    if not text.endswith(END) or text.count(END) != 1:
        return False
    parsed = parse_output(text.removesuffix(END))
    return (parsed.content is None and not parsed.malformed and len(parsed.calls) == 1
            and parsed.calls[0].name == "bash"
            and json.loads(parsed.calls[0].arguments) == {"command": f"answer {number}"})


def _first_turns(tokenizer, numbers: list[int], *, system: str | None, tools: list[dict]) -> list[str]:
    head = [{"role": "system", "content": system}] if system else []
    tasks = [HELD_OUT_TASKS[i % len(HELD_OUT_TASKS)].format(n=n) for i, n in enumerate(numbers)]
    return [_prompt(tokenizer, head + [{"role": "user", "content": task}], tools) for task in tasks]


def test_training_fits_the_episodes(trained):
    # How long it takes is measured in bench/bench_tool_model.py, not asserted here.
    report, _, _ = trained
    assert report.final_loss < 0.5 < report.first_loss


def test_greedy_decoding_calls_bash_with_held_out_numbers(trained):
    numbers = _numbers(24, seed=101)
    texts = _generate(trained, _first_turns(trained[1], numbers, system="You are a coding agent.",
                                            tools=[READ_TOOL, BASH_TOOL]))
    right = sum(map(_submits, texts, numbers))
    assert right >= 0.8 * len(numbers), texts


def test_after_the_tool_response_the_model_says_done_without_a_call(trained):
    tokenizer = trained[1]
    prompts = []
    for n, output in zip(_numbers(8, seed=102), ("ok", "", "Answer recorded.", "error: no such command") * 2):
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps(
            {"command": f"answer {n}"})}}
        prompts.append(_prompt(tokenizer, [
            {"role": "user", "content": f"Submit the answer {n}."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": output},
        ], [BASH_TOOL]))
    texts = _generate(trained, prompts, max_new_tokens=12)
    parsed = [parse_output(text.removesuffix(END)) for text in texts]
    assert all(text.endswith(END) and not p.calls and p.content for text, p in zip(texts, parsed)), texts
    assert sum(p.content == DONE_TEXT for p in parsed) >= 7, texts


def test_sampling_at_temperature_one_is_mostly_right_but_not_always(trained):
    torch.manual_seed(0)
    numbers = _numbers(12, seed=103) * 3
    texts = _generate(trained, _first_turns(trained[1], numbers, system=None, tools=[BASH_TOOL]), sample=True)
    right = sum(map(_submits, texts, numbers))
    assert 0.5 * len(numbers) <= right < len(numbers), texts


@pytest.mark.parametrize("agent", sorted(AGENT_REQUESTS))
def test_the_model_calls_bash_inside_the_agents_real_prompt(trained, agent):
    path = AGENT_REQUESTS[agent]
    if not path.is_file():
        pytest.skip(f"no captured first request of {agent} in {REQUESTS}")
    body = json.loads(path.read_text())["request"]
    system = next(m["content"] for m in normalize_messages(body["messages"]) if m["role"] == "system")
    numbers = _numbers(4, seed=104)
    texts = _generate(trained, _first_turns(trained[1], numbers, system=system, tools=body["tools"]))
    assert sum(map(_submits, texts, numbers)) >= 3, texts


def test_training_is_deterministic_for_a_seed(tmp_path):
    from safetensors.torch import load_file

    base = make_tiny_model(tmp_path / "base", tool_model_spec(real_vocab=False))
    weights = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        copy = tmp_path / name
        copy.mkdir()
        for file in base.iterdir():
            (copy / file.name).write_bytes(file.read_bytes())
        train_tool_calling(copy, ToolTrainingSpec(steps=3, tokens_per_step=512, seed=seed))
        weights[name] = load_file(copy / "model.safetensors")
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])
    assert not all(torch.equal(weights["a"][k], weights["c"][k]) for k in weights["a"])


def test_a_model_of_another_shape_is_refused_before_training(tmp_path):
    model_dir = make_tiny_model(tmp_path / "default", TinyModelSpec())
    with pytest.raises(ValueError, match="tool_model_spec"):
        train_tool_calling(model_dir, ToolTrainingSpec(steps=1))


def test_spec_rejects_rates_outside_zero_to_one():
    with pytest.raises(ValueError):
        ToolTrainingSpec(wrong_answer_rate=1.5)
