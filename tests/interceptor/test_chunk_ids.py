"""`ChunkIds`: long chunks of rendered text are encoded once and remembered across rollouts, and the ids of a
whole text are exactly those the tokenizer gives it, whichever chunks were remembered."""

from __future__ import annotations

import pytest

from interceptor.tokens.chunk_ids import ChunkIds
from interceptor.tokens.rendering import Renderer, RendererConfig

SYSTEM = "You are a coding agent. Use the tools to inspect and change files; answer with the result. " * 200
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Does what its name says. " * 10,
                                           "parameters": {"type": "object", "properties": {}}}} for i in range(8)]


@pytest.fixture
def renderer(tiny_model_dir):
    return Renderer(RendererConfig(model_dir=tiny_model_dir))


def test_rollouts_of_one_agent_encode_its_system_prompt_and_tools_once(renderer):
    results = []
    for task in ("Fix the bug in parser.py. " * 30, "Add a test for the tokenizer. " * 30, "Explain main.py. " * 30):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        ids = renderer.render_full(messages, TOOLS)
        text = renderer.render_text(messages, TOOLS, generation_prompt=True)
        assert ids == renderer.tokenizer.encode(text, add_special_tokens=False)  # token-exact
        results.append((renderer._chunks.hits, renderer._chunks.misses))
    assert results[0][0] == 0 and results[1][0] == 1 and results[2][0] == 2  # the system chunk, every time after


def test_kept_ids_are_bounded_and_the_oldest_go_first():
    encoded: list[list[str]] = []

    def encode_batch(pieces: list[str]) -> list[list[int]]:
        encoded.append(list(pieces))
        return [[ord(c) for c in piece] for piece in pieces]

    chunks = ChunkIds(max_ids=5000, min_chars=1000)
    a, b, c = "a" * 2000, "b" * 2000, "c" * 2000
    assert chunks.encode([a, "x"], encode_batch) == [ord("a")] * 2000 + [ord("x")]
    chunks.encode([b], encode_batch)
    chunks.encode([a], encode_batch)  # kept: not encoded again
    assert encoded == [[a, "x"], [b]]
    chunks.encode([c], encode_batch)  # 6000 ids > 5000: the least recently used (b) goes
    chunks.encode([a, b], encode_batch)
    assert encoded[-1] == [b]


def test_a_conversation_shorter_than_a_long_text_still_reuses_its_system_prompt_and_tools(renderer):
    """First turns of real agents are mostly 2k-16k characters: their system chunk is remembered too."""
    system = "You are a coding agent. Use the tools and answer with the result. " * 40  # ~2.6k characters
    for n, task in enumerate(("Fix parser.py.", "Add a test.", "Explain main.py.")):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        text = renderer.render_text(messages, TOOLS, generation_prompt=True)
        assert len(text) < 16 * 1024
        assert renderer.render_full(messages, TOOLS) == renderer.tokenizer.encode(text, add_special_tokens=False)
        assert renderer._chunks.hits == n  # the system and tools chunk, every time after the first


def test_decoding_sampled_ids_gives_the_tokenizers_text(renderer):
    text = "<think>\nplan: ünïcode → ✓\n</think>\n\n<tool_call>\n{\"name\": \"ls\"}\n</tool_call><|im_end|>"
    ids = renderer.tokenizer.encode(text, add_special_tokens=False)
    assert renderer._decode_direct  # the tiny model's tokenizer cleans nothing up: the Rust decoder is called directly
    for cut in (ids, ids[:-1], ids[:7], ids[3:], []):  # cuts can split a multi-byte character
        assert renderer.decode(cut) == renderer.tokenizer.decode(cut, skip_special_tokens=True)


def test_a_long_conversation_is_encoded_a_stretch_at_a_time_and_its_json_is_the_tokenizers_ids(renderer):
    """Its ids as JSON are made chunk by chunk: a batch call takes ~256 KB of text, never the whole conversation, so
    a 10 MB request never holds all its ids as Python ints at once."""
    import orjson

    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "ünïcode and words " * 400}
             for i in range(121)]
    messages = [{"role": "system", "content": SYSTEM}, *turns]
    text = renderer.render_text(messages, TOOLS, generation_prompt=True)
    assert len(text) > 3 * 256 * 1024
    calls: list[int] = []
    encode_batch = renderer._encode_batch
    renderer._encode_batch = lambda texts: (calls.append(sum(map(len, texts))), encode_batch(texts))[1]
    ids = renderer.render_full_json(messages, TOOLS)
    expected = renderer.tokenizer.encode(text, add_special_tokens=False)
    assert orjson.loads(ids.json) == expected and ids.count == len(expected)  # token-exact
    assert len(calls) >= 3 and max(calls) < 300 * 1024 and sum(calls) == len(text)
    calls.clear()
    assert renderer.render_full_json(messages, TOOLS) == ids and calls  # short chunks are encoded again, long ones kept
    assert renderer.render_full(messages, TOOLS) == expected
