"""The facts about vLLM's `/v1/completions` and dev endpoints that the interceptor and trainer rely on, checked
against a real vLLM (the CPU build, default `--logprobs-mode raw_logprobs`) serving the session's tiny model.

- A prompt given as token ids comes back as `prompt_token_ids`; the sampled ids come back as `token_ids`, with one
  float in `logprobs.token_logprobs` per id (for `logprobs` 0 and 1 alike), never None.
- A stop token (end of turn, or one of `stop_token_ids`) is the last of `token_ids` and has a logprob, but its text is
  not in `text`.
- A request `seed` fixes the sample, also when requests are batched together.
- `prompt_logprobs` over prompt + sampled ids reproduce the sampled logprobs (a teacher-forced pass agrees with what
  the sampler saw), and these are the model's raw log-softmax whatever the temperature or top-k.
- `/pause`, `/collective_rpc reload_weights`, `/resume` swap the weights, and no key/value computed with the old
  weights survives in the prefix cache.

See tests/data/vllm_completion_example.json for a whole response.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]  # ordinary BPE tokens of the tiny model, no special tokens
MAX_TOKENS = 12
# Two full KV-cache blocks (128 tokens each on CPU) and more: a second request with this prompt reads 256 tokens
# of keys and values from the prefix cache instead of computing them.
LONG_PROMPT = [10 + (i * 7) % 500 for i in range(300)]
LOGPROB_TOLERANCE = 1e-4
REQUEST_TIMEOUT_S = 120  # one request on 2 busy cores; a tiny model answers in well under a second


@pytest.fixture
async def http(vllm_server: VllmServer) -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(base_url=vllm_server.base_url, timeout=timeout) as session:
        yield session


async def post(http: aiohttp.ClientSession, path: str, body: dict | None = None, **params: str) -> dict | None:
    async with http.post(path, json=body, params=params) as response:
        text = await response.text()
        assert response.status == 200, f"POST {path} -> {response.status}: {text}"
        return json.loads(text) if text else None


async def complete(http: aiohttp.ClientSession, **overrides) -> dict:
    """One choice of a seeded, logprob-returning completion over PROMPT, the way the interceptor asks."""
    body = {
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "seed": 1,
        "return_token_ids": True,
        "logprobs": 1,
    } | overrides
    response = await post(http, "/v1/completions", body)
    [choice] = response["choices"]
    return choice


def sampled_logprobs(choice: dict) -> list[float]:
    return choice["logprobs"]["token_logprobs"]


async def teacher_forced_logprobs(http: aiohttp.ClientSession, prompt: list[int], completion: list[int]) -> list[float]:
    """The logprob of each completion id given the ids before it, from one prompt_logprobs pass (which never reads
    the prefix cache)."""
    choice = await complete(http, prompt=prompt + completion, max_tokens=1, prompt_logprobs=0)
    entries = choice["prompt_logprobs"]  # one per prompt position: None first, then {"<id>": {"logprob", ...}}
    assert len(entries) == len(prompt) + len(completion) and entries[0] is None
    return [entries[len(prompt) + i][str(token)]["logprob"] for i, token in enumerate(completion)]


async def test_tiny_model_samples_from_a_spread_distribution(http):
    # Every other test here is vacuous on a model that puts all its mass on one token (logprobs all 0.0, every
    # seed and every weight giving the same ids), so say so plainly first.
    logprobs = sampled_logprobs(await complete(http))
    assert sum(logprobs) / len(logprobs) < -0.5, f"tiny model samples almost deterministically: {logprobs}"


@pytest.mark.parametrize("logprobs", [0, 1])
async def test_token_id_prompt_returns_sampled_ids_with_one_logprob_each(http, logprobs):
    choice = await complete(http, logprobs=logprobs)

    assert choice["prompt_token_ids"] == PROMPT
    token_ids = choice["token_ids"]
    assert 0 < len(token_ids) <= MAX_TOKENS
    assert len(sampled_logprobs(choice)) == len(token_ids)
    assert all(isinstance(lp, float) and lp <= 0.0 for lp in sampled_logprobs(choice))  # None is not a float
    assert choice["finish_reason"] in {"length", "stop"}


async def test_end_of_turn_token_is_in_token_ids_but_not_in_text(http, vllm_server):
    eos = json.loads((vllm_server.model_dir / "config.json").read_text())["eos_token_id"]
    # min_tokens holds the end of turn back for 3 tokens (leaving their sample unchanged); the bias then forces it.
    ended = await complete(http, min_tokens=3, logit_bias={str(eos): 100.0})
    cut = await complete(http, max_tokens=3)

    assert ended["token_ids"] == cut["token_ids"] + [eos]
    assert len(sampled_logprobs(ended)) == 4
    assert ended["text"] == cut["text"]
    assert (ended["finish_reason"], ended["stop_reason"]) == ("stop", None)  # None: the model's own EOS


async def test_stop_token_id_is_in_token_ids_but_not_in_text(http):
    free = (await complete(http))["token_ids"]
    k = next((i for i in range(2, len(free)) if free[i] not in free[:i]), None)  # a repeat would stop earlier
    assert k is not None, f"no token to stop on in {free}"
    stopped = await complete(http, stop_token_ids=[free[k]])
    cut = await complete(http, max_tokens=k)

    assert stopped["token_ids"] == free[: k + 1]
    assert len(sampled_logprobs(stopped)) == k + 1
    assert stopped["text"] == cut["text"]
    assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", free[k])


async def test_seed_makes_sampling_repeatable_even_when_batched(http):
    first, again = await asyncio.gather(complete(http, seed=7), complete(http, seed=7))
    other = await complete(http, seed=8)

    assert again["token_ids"] == first["token_ids"]
    assert sampled_logprobs(again) == sampled_logprobs(first)
    assert other["token_ids"] != first["token_ids"]  # the seed decides, not a degenerate model


async def test_prompt_logprobs_reproduce_the_sampled_tokens_logprobs(http):
    choice = await complete(http)

    teacher = await teacher_forced_logprobs(http, PROMPT, choice["token_ids"])
    assert teacher == pytest.approx(sampled_logprobs(choice), abs=LOGPROB_TOLERANCE)


async def test_sampled_logprobs_are_raw_whatever_the_temperature_and_top_k(http):
    # raw_logprobs mode: log_softmax(logits) before temperature, top-k/top-p, penalties and logit_bias. A trainer
    # that scores with logits / temperature, or only over the top-k, would see a different distribution.
    choice = await complete(http, temperature=0.5, top_k=3)

    teacher = await teacher_forced_logprobs(http, PROMPT, choice["token_ids"])
    assert teacher == pytest.approx(sampled_logprobs(choice), abs=LOGPROB_TOLERANCE)


async def test_reload_weights_between_pause_and_resume_changes_outputs(http, vllm_server, tmp_path):
    before = await complete(http, prompt=LONG_PROMPT, seed=3)  # also leaves LONG_PROMPT's KV in the prefix cache
    perturbed = write_perturbed_weights(vllm_server.model_dir, tmp_path / "perturbed")
    try:
        await swap_weights(http, perturbed)
        after = await complete(http, prompt=LONG_PROMPT, seed=3)
        teacher = await teacher_forced_logprobs(http, LONG_PROMPT, after["token_ids"])
    finally:
        await swap_weights(http, vllm_server.model_dir)  # the server is shared by the whole session
    restored = await complete(http, prompt=LONG_PROMPT, seed=3)

    assert after["token_ids"] != before["token_ids"]
    # Sampled with the new weights throughout: the cached prefix was dropped, not reused with the old weights' KV.
    assert teacher == pytest.approx(sampled_logprobs(after), abs=LOGPROB_TOLERANCE)
    assert (restored["token_ids"], sampled_logprobs(restored)) == (before["token_ids"], sampled_logprobs(before))


async def swap_weights(http: aiohttp.ClientSession, weights_dir: Path) -> None:
    """The disk weight sync: pause (drain, then drop the KV and prefix caches), reload from disk, resume."""
    await post(http, "/pause", mode="wait")
    try:
        result = await post(
            http, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}
        )
        assert result == {"results": [None]}  # one None per worker
    finally:
        await post(http, "/resume")


def write_perturbed_weights(model_dir: Path, out: Path) -> Path:
    """A copy of the model with every weight moved by a fraction of its spread (config + safetensors only, which
    is all reload_weights reads)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            noise = torch.randn(weight.shape, generator=generator)
            weight.add_(noise * 0.5 * weight.std().clamp(min=1e-3))
    model.save_pretrained(out)
    return out
