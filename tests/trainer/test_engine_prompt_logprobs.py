"""Prompt logprobs are computed a chunk of positions at a time, so a long prompt with a large vocabulary never
holds [prompt, vocabulary] logits, and the chunk size changes nothing: values, ranks and top tokens equal one
forward pass over the whole prompt. (The memory figure itself is measured by bench/bench_prompt_memory.py.)"""

from __future__ import annotations

import aiohttp
import pytest
import torch

from trainer.engine import EngineConfig, LocalEngine
from trainer.engine.logprobs import gather_logprobs, prompt_logprobs

PROMPT = [10 + (i * 37) % 600 for i in range(100)]  # 99 positions with logprobs: 7 chunks of 16
TOP = 5


async def _prompt_logprobs(model_dir, *, chunk: int, **overrides) -> dict:
    config = EngineConfig(model=model_dir, port=0, prompt_logprobs_chunk=chunk)
    body = {"prompt": PROMPT, "max_tokens": 4, "seed": 3, "return_token_ids": True, "prompt_logprobs": TOP}
    async with LocalEngine(config) as engine, aiohttp.ClientSession(base_url=engine.base_url) as http:
        async with http.post("/v1/completions", json=body | overrides) as response:
            payload = await response.json()
            assert response.status == 200, payload
            return payload["choices"][0]


def _reference(model) -> torch.Tensor:
    """Log-softmax of one plain forward pass over the prompt: row i predicts PROMPT[i + 1]."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([PROMPT])).logits[0, :-1].float().log_softmax(dim=-1)


async def test_prompt_logprobs_over_many_chunks_equal_a_forward_pass_over_the_prompt(tiny_model_dir, reference_model):
    choice = await _prompt_logprobs(tiny_model_dir, chunk=16)

    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(PROMPT)
    reference = _reference(reference_model)
    for position, entry in enumerate(entries[1:]):
        row, token = reference[position], PROMPT[position + 1]
        top_values, top_ids = row.topk(TOP)
        expected = {token: (float(row[token]), int((row >= row[token]).sum()))}
        expected |= {i: (v, rank) for rank, (i, v) in enumerate(zip(top_ids.tolist(), top_values.tolist()), 1)}
        assert [int(key) for key in entry] == list(expected), position  # the prompt's token, then the top ones
        assert [item["rank"] for item in entry.values()] == [rank for _, rank in expected.values()], position
        got = [item["logprob"] for item in entry.values()]
        assert got == pytest.approx([value for value, _ in expected.values()], abs=1e-6), position


async def test_the_chunk_size_changes_neither_prompt_logprobs_nor_the_sample(tiny_model_dir):
    chunked = await _prompt_logprobs(tiny_model_dir, chunk=16)
    other = await _prompt_logprobs(tiny_model_dir, chunk=48)
    whole = await _prompt_logprobs(tiny_model_dir, chunk=4096)
    without = await _prompt_logprobs(tiny_model_dir, chunk=16, prompt_logprobs=None)

    assert chunked["prompt_logprobs"] == other["prompt_logprobs"] == whole["prompt_logprobs"]
    assert chunked["token_ids"] == other["token_ids"] == whole["token_ids"] == without["token_ids"]


class _CountingHead(torch.nn.Module):
    """The model's output embedding, recording how many positions each product covers."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head
        self.rows: list[int] = []

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.rows.append(hidden.shape[0])
        return self.head(hidden)


@pytest.mark.parametrize("top", [TOP, -1])  # -1: the whole vocabulary, ranked
def test_chunked_records_equal_the_whole_prompt_at_once_and_stay_within_the_chunk(reference_model, top):
    with torch.inference_mode():
        hidden = reference_model.get_decoder()(input_ids=torch.tensor([PROMPT])).last_hidden_state[0, :-1]
        tokens = torch.tensor(PROMPT[1:])
        at_once = gather_logprobs(reference_model.lm_head(hidden).float().log_softmax(dim=-1), tokens, top)
        for chunk in (16, 33, 98, 99, 500):  # 98: a one-row remainder, which a chunk of its own would round apart
            head = _CountingHead(reference_model.get_output_embeddings())

            assert prompt_logprobs(head, hidden, tokens, top, chunk=chunk) == at_once, chunk
            assert max(head.rows) == min(chunk, len(tokens)), chunk
            assert sum(head.rows) < len(tokens) + chunk, chunk


def test_a_chunk_must_hold_a_position(tiny_model_dir):
    with pytest.raises(ValueError, match="prompt_logprobs_chunk"):
        EngineConfig(model=tiny_model_dir, prompt_logprobs_chunk=0)
