"""The local engine's dev-mode controls and in-process API: pause/resume in vLLM's three modes, weight reloads
from disk and in-process weight updates, and an event loop that stays responsive while the model works."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.engine import SamplingParams

EXACT = 1e-5
PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
LONG = SamplingParams(max_tokens=4000, seed=1, ignore_eos=True)


async def complete(http, **overrides) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 16, "seed": 3, "return_token_ids": True, "logprobs": 0} | overrides
    async with http.post("/v1/completions", json=body) as response:
        payload = await response.json()
        assert response.status == 200, payload
        return payload["choices"][0]


async def post(http, path: str, **params) -> dict:
    async with http.post(path, params=params) as response:
        assert response.status == 200
        return await response.json()


async def started(stream) -> None:
    """Wait until a generation has sampled its first token (it holds a batch row)."""
    events = stream.events()
    await anext(events)


async def test_health_answers_while_a_long_generation_runs(http, engine):
    long = engine.core.start(PROMPT, LONG)
    await started(long)

    latencies = []
    for _ in range(5):
        begin = time.perf_counter()
        async with http.get("/health") as response:
            assert response.status == 200 and await response.read() == b""
        latencies.append(time.perf_counter() - begin)
        await asyncio.sleep(0.02)

    assert max(latencies) < 0.5
    engine.core.abort(long)
    assert (await long.result()).finish_reason == "abort"


async def test_a_client_that_hangs_up_aborts_its_generation(engine):
    body = {"prompt": PROMPT, "max_tokens": LONG.max_tokens, "ignore_eos": True}  # seconds of work if left to run
    async with aiohttp.ClientSession(base_url=engine.base_url) as session:
        with pytest.raises(asyncio.TimeoutError):
            async with session.post("/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.3)):
                pass

    for _ in range(50):
        if engine.core.active_requests == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.core.active_requests == 0


async def test_pause_abort_ends_inflight_requests_and_holds_new_ones_until_resume(http, engine):
    long = engine.core.start(PROMPT, LONG)
    await started(long)

    assert await post(http, "/pause", mode="abort") == {"status": "paused"}
    aborted = await long.result()
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < LONG.max_tokens
    assert await _get(http, "/is_paused") == {"is_paused": True}

    held = asyncio.create_task(complete(http))
    await asyncio.sleep(0.3)
    assert not held.done()
    assert await post(http, "/resume") == {"status": "resumed"}
    assert (await held)["finish_reason"] == "length"
    assert await _get(http, "/is_paused") == {"is_paused": False}


async def test_pause_wait_returns_when_inflight_requests_are_done(http, engine):
    running = engine.core.start(PROMPT, SamplingParams(max_tokens=300, seed=1, ignore_eos=True))
    await started(running)

    await engine.pause("wait")

    finished = await asyncio.wait_for(running.result(), timeout=0.05)  # already there: pause waited for it
    assert finished.finish_reason == "length"
    held = asyncio.create_task(complete(http))
    await asyncio.sleep(0.2)
    assert not held.done()
    await post(http, "/resume")
    await held


async def test_pause_keep_freezes_requests_and_resume_continues_them_exactly(http, engine):
    reference = await complete(http, max_tokens=200, ignore_eos=True)
    frozen = asyncio.create_task(complete(http, max_tokens=200, ignore_eos=True))
    await asyncio.sleep(0.05)

    await post(http, "/pause", mode="keep")
    await asyncio.sleep(0.2)
    assert not frozen.done()
    await post(http, "/resume")

    resumed = await frozen
    assert resumed["token_ids"] == reference["token_ids"]
    assert resumed["logprobs"]["token_logprobs"] == pytest.approx(reference["logprobs"]["token_logprobs"], abs=EXACT)


async def test_reload_weights_over_http_changes_outputs_and_reloading_restores_them(
    http, engine, tiny_model_dir, tmp_path
):
    before = await complete(http)
    perturbed = _write_perturbed_weights(tiny_model_dir, tmp_path / "perturbed")

    await _swap_weights(http, perturbed)
    after = await complete(http)
    await _swap_weights(http, tiny_model_dir)
    restored = await complete(http)

    assert after["token_ids"] != before["token_ids"]
    assert (restored["token_ids"], restored["logprobs"]) == (before["token_ids"], before["logprobs"])
    assert engine.weight_version == 2


async def test_update_weights_in_process_changes_outputs_and_bumps_the_version(engine, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_tokens=16, seed=3, logprobs=0)
    before = await engine.generate(PROMPT, params)
    perturbed = AutoModelForCausalLM.from_pretrained(
        _write_perturbed_weights(tiny_model_dir, tmp_path / "perturbed"), dtype=torch.float32
    ).eval()

    await engine.pause("wait")
    version = await engine.update_weights(perturbed.named_parameters())
    await engine.resume()
    after = await engine.generate(PROMPT, params)

    assert version == engine.weight_version == 1
    assert after.token_ids != before.token_ids
    expected = teacher_forced_logprobs(perturbed, PROMPT, after.token_ids)
    assert [record.logprob for record in after.logprobs] == pytest.approx(expected, abs=EXACT)


async def test_update_weights_with_an_unknown_name_changes_nothing(engine):
    params = SamplingParams(max_tokens=8, seed=3)
    before = await engine.generate(PROMPT, params)
    embedding = engine.core.policy.model.get_input_embeddings().weight

    with pytest.raises(ValueError, match="unknown weight 'not.a.weight'"):
        await engine.update_weights([("model.embed_tokens.weight", torch.zeros_like(embedding)),
                                     ("not.a.weight", torch.zeros(1))])

    assert engine.weight_version == 0
    assert (await engine.generate(PROMPT, params)).token_ids == before.token_ids


async def test_stopping_the_engine_fails_inflight_generations(tiny_model_dir):
    from trainer.engine import EngineConfig, EngineStopped, LocalEngine

    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as engine:
        long = engine.core.start(PROMPT, LONG)
        await started(long)
    with pytest.raises(EngineStopped):
        await long.result()


async def _get(http, path: str) -> dict:
    async with http.get(path) as response:
        assert response.status == 200
        return await response.json()


async def _swap_weights(http, weights_dir: Path) -> None:
    await post(http, "/pause", mode="wait")
    try:
        async with http.post(
            "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}
        ) as response:
            assert response.status == 200 and await response.json() == {"results": [None]}
    finally:
        await post(http, "/resume")


def _write_perturbed_weights(model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator) * 0.5 * weight.std().clamp(min=1e-3))
    model.save_pretrained(out)
    return out


async def test_a_failing_model_step_fails_its_request_and_the_engine_keeps_serving(http, engine, monkeypatch):
    model = engine.core.policy.model
    forward = model.forward
    failures = iter([RuntimeError("injected")])

    def flaky_forward(*args, **kwargs):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", flaky_forward)
    async with http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4}) as response:
        payload = await response.json()

    assert response.status == 500 and payload["error"]["type"] == "InternalServerError"
    assert "injected" in payload["error"]["message"]
    assert (await complete(http))["finish_reason"] == "length"


async def test_weights_update_while_paused_with_keep_and_frozen_requests_finish_on_the_new_weights(engine):
    running = engine.core.start(PROMPT, SamplingParams(max_tokens=300, seed=2, ignore_eos=True))
    await started(running)

    await engine.pause("keep")
    embedding = engine.core.policy.model.get_input_embeddings().weight
    version = await asyncio.wait_for(
        engine.update_weights([("model.embed_tokens.weight", embedding * 1.5)]), timeout=5
    )
    await engine.resume()

    finished = await running.result()
    assert version == 1 and (finished.finish_reason, finished.weight_version) == ("length", 1)
