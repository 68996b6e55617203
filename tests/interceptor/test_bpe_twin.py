"""The tiktoken twin gives the tokenizer's ids, is built only where it can, and turns itself off on a difference."""

from __future__ import annotations

import json
import logging
import random
import shutil

import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.tokens.bpe_twin import AUDIT_EVERY, BpeTwin, build_twin
from interceptor.tokens.rendering import Renderer, RendererConfig
from tests.fakes import ScriptedUpstream
from tests.interceptor.test_trajectories import TOOLS, call_text, echo

SECRET = "sk-live-0123456789"


@pytest.fixture(scope="module")
def real_vocab_dir(tmp_path_factory):
    """Qwen's real vocabulary (150k BPE ranks and Qwen3's added tokens) with Qwen3's chat template."""
    from trainer.models.tiny_model import TinyModelSpec, tiny_tokenizer

    out = tmp_path_factory.mktemp("real-vocab")
    tiny_tokenizer(TinyModelSpec(real_vocab=True)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def twin_and_reference(real_vocab_dir):
    tokenizer = AutoTokenizer.from_pretrained(real_vocab_dir)
    twin, why = build_twin(tokenizer, real_vocab_dir)
    assert twin is not None, why
    rust = tokenizer._tokenizer
    return twin, lambda texts: [e.ids for e in rust.encode_batch(texts, add_special_tokens=False)]


def _fuzz_texts() -> list[str]:
    """Runs of one character (where a token has several cuts into two tokens, ties could part the two BPEs), small
    alphabets mixed at random, every pair of ASCII characters between a letter and a digit, and the added tokens."""
    rng = random.Random(7)
    alphabet = [" ", "-", "=", "a", "b", "\n", "\t", "*", "#", "/", ".", "0", "1", "_", '"', "'", "S", "(", "}", "\r"]
    texts = [f"{pre}{c * n}{post}" for n in range(1, 90) for c in alphabet for pre, post in (("", ""), (" ", " x"))]
    for _ in range(15_000):
        letters = rng.sample(alphabet, rng.randint(2, 4))
        texts.append("".join(rng.choice(letters) for _ in range(rng.randint(1, 40))))
    texts += [f"a{chr(i)}{chr(j)} 1{chr(i)}" for i in range(128) for j in range(0, 128, 3)]
    texts += ["<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>"]
    return texts


def test_the_twin_gives_the_tokenizers_ids_on_runs_mixes_and_every_ascii_pair(twin_and_reference):
    twin, reference = twin_and_reference
    texts = _fuzz_texts()
    differing = [t for t, ids in zip(texts, reference(texts)) if twin._encoding.encode(t, allowed_special="all") != ids]
    assert not differing, differing[:5]


def test_the_twin_answers_only_for_ascii_text(twin_and_reference):
    twin, reference = twin_and_reference
    assert twin.encode("café 数学") is None
    assert twin.encode("plain ascii, 42 tokens?") == reference(["plain ascii, 42 tokens?"])[0]


def test_renders_through_the_twin_give_the_ids_of_renders_without_it(real_vocab_dir):
    with_twin = Renderer(RendererConfig(model_dir=real_vocab_dir))
    without = Renderer(RendererConfig(model_dir=real_vocab_dir, tiktoken_twin=False))
    assert with_twin.twin is not None and without.twin is None and without.twin_absent_because == "not asked for"
    listing = "\n".join(f"-rw-r--r--  1 user  staff  {i * 37} Nov 24 {i % 24:02d}:00 file_{i}.py" for i in range(900))
    conversations = [
        [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list the files"}],
        [{"role": "user", "content": "naïve café → ✓ 数学"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": listing}],  # a long text (> 16k characters), cut into chunks
        [{"role": "user", "content": "x = 1\r\n\r\n    return  {'a':  [1,2]}\t\t# it's ok   "}],
    ]
    for messages in conversations:
        assert with_twin.render_full(messages, TOOLS) == without.render_full(messages, TOOLS)
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}]}
    for result in (listing[:3000], "Ünïcödé output", "   \n\n  trailing spaces   \n"):
        new = [{"role": "tool", "tool_call_id": "c1", "content": result}]
        got = with_twin.render_suffix(system=None, last_assistant=assistant, new_messages=new, tools=TOOLS)
        assert got == without.render_suffix(system=None, last_assistant=assistant, new_messages=new, tools=TOOLS)


class _WrongOnce:
    """transformers' ids, but one more id for one text: what an audit would find if the twin were wrong."""

    def __init__(self, reference, wrong_text: str) -> None:
        self.reference, self.wrong_text = reference, wrong_text

    def __call__(self, texts):
        return [ids + [0] if t == self.wrong_text else ids for t, ids in zip(texts, self.reference(texts))]


def test_a_difference_found_by_the_audit_turns_the_twin_off_and_answers_with_the_tokenizers_ids(
    twin_and_reference, caplog
):
    shared, reference = twin_and_reference
    twin = BpeTwin(shared._encoding, _WrongOnce(reference, SECRET))
    for _ in range(AUDIT_EVERY - 1):
        assert twin.encode("checked 1 in 64") == reference(["checked 1 in 64"])[0]
    assert twin.on and twin.mismatches == 0
    with caplog.at_level(logging.ERROR, logger="interceptor.tokenizer"):
        assert twin.encode(SECRET) == reference([SECRET])[0] + [0]  # the audited call answers with the reference
    assert not twin.on and twin.mismatches == 1
    assert twin.encode("anything") is None  # off for good: the renderer falls back to transformers
    assert "off for the rest of this process" in caplog.text and SECRET not in caplog.text


def test_the_twin_decodes_sampled_ids_to_the_tokenizers_text(real_vocab_dir):
    """Random runs over the whole vocabulary (broken UTF-8 where tokens meet, special tokens to leave out, the
    added tokens the tool-call parser reads), and a turn as the model samples it."""
    tokenizer = AutoTokenizer.from_pretrained(real_vocab_dir)
    twin, why = build_twin(tokenizer, real_vocab_dir)
    assert twin is not None and twin.decodes, why
    rust = tokenizer._tokenizer
    rng = random.Random(11)
    size = len(tokenizer)
    runs = [[rng.randrange(size) for _ in range(rng.randint(1, 80))] for _ in range(4000)]
    runs += [[rng.choice(sorted(tokenizer.added_tokens_decoder)) for _ in range(6)] for _ in range(200)]
    runs.append(tokenizer.encode('<think>\nok</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'))
    differing = [run for run in runs if twin.decode(run) != rust.decode(run, skip_special_tokens=True)]
    assert not differing, differing[:3]
    assert twin.decode([size + 5]) is None  # an id the tokenizer lacks (a padded embedding): transformers decodes it


def test_a_decode_the_audit_finds_different_turns_the_twins_decoding_off(twin_and_reference, caplog):
    shared, reference = twin_and_reference
    truth = shared._reference_decode
    twin = BpeTwin(shared._encoding, reference, skipped=shared._skipped,
                   reference_decode=lambda ids: truth(ids) + ("!" if ids == [42] else ""))
    for _ in range(AUDIT_EVERY - 1):
        assert twin.decode([40, 41]) == truth([40, 41])
    assert twin.decodes and twin.decode_mismatches == 0
    with caplog.at_level(logging.ERROR, logger="interceptor.tokenizer"):
        assert twin.decode([42]) == truth([42]) + "!"  # the audited call answers with the reference
    assert not twin.decodes and twin.decode_mismatches == 1 and "decoding is off" in caplog.text
    assert twin.decode([40]) is None and twin.encode("still encodes") is not None


def test_no_twin_decoding_where_transformers_cleans_up_spaces(real_vocab_dir, tmp_path):
    out = tmp_path / "cleans-up"
    shutil.copytree(real_vocab_dir, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    twin, why = build_twin(AutoTokenizer.from_pretrained(out), out)
    assert twin is not None and not twin.decodes, why
    assert twin.decode([40]) is None


def _variant(real_vocab_dir, tmp_path, change) -> tuple[BpeTwin | None, str]:
    out = tmp_path / "variant"
    shutil.copytree(real_vocab_dir, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    change(spec)
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return build_twin(AutoTokenizer.from_pretrained(out), out)


def _swap_two_merges(spec):
    merges = spec["model"]["merges"]
    merges[10], merges[5000] = merges[5000], merges[10]


def _drop_a_merge(spec):
    del spec["model"]["merges"][5000]


def _lowercase(spec):
    spec["normalizer"] = {"type": "Lowercase"}


def _gpt2_pre_tokenizer(spec):
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_swap_two_merges, "not in the order of the ids they make"),
        (_drop_a_merge, "makes a token but is not a merge"),
        (_lowercase, "the normalizer Lowercase can change ASCII text"),
        (_gpt2_pre_tokenizer, "not a split regex then byte-level"),
    ],
    ids=["merges-out-of-rank-order", "merges-incomplete", "lowercasing-normalizer", "byte-level-regex"],
)
def test_no_twin_where_its_ids_could_differ(real_vocab_dir, tmp_path, change, why):
    twin, reason = _variant(real_vocab_dir, tmp_path, change)
    assert twin is None and why in reason


def test_no_twin_for_a_vocabulary_trained_by_tokenizers(tiny_model_dir):
    """The test vocabulary is trained by `tokenizers` itself: its merges are not in the order of the ids they make."""
    renderer = Renderer(RendererConfig(model_dir=tiny_model_dir))
    assert renderer.twin is None and renderer.twin_absent_because


async def _play(model_dir, *, twin: bool) -> list[list[int]]:
    """A tool loop through the gate: ASCII and non-ASCII tool results, and a long one; the prompts the policy saw."""
    async with ScriptedUpstream(model_dir) as upstream:
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=model_dir, tiktoken_twin=twin,
                              max_model_len=32768)
        async with InterceptionServer(config) as server:
            handle = server.open_rollout()
            messages = [{"role": "system", "content": "You are a coding agent."},
                        {"role": "user", "content": "Fix the failing test in tests/test_io.py"}]
            results = ["tests/test_io.py::test_read FAILED\n  assert 'a' == 'b'", "naïve → ✓", "output line 42\n" * 1200, "done"]
            async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
                for result in results:
                    upstream.script(call_text("cat tests/test_io.py"))
                    response = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
                    messages.append(echo(response.choices[0].message))
                    call = response.choices[0].message.tool_calls[0]
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            await server.finish_rollout(handle.id)
            used = server.policy.renderer.twin
            assert (used is not None and used._calls > 0) if twin else used is None
            return [c.prompt_ids for c in upstream.calls]


async def test_the_gate_sends_the_policy_the_same_prompts_with_the_twin_and_without(real_vocab_dir):
    assert await _play(real_vocab_dir, twin=True) == await _play(real_vocab_dir, twin=False)
