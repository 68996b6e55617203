"""Weight syncs the way TRL's AsyncGRPOTrainer drives them (pause, send_weights, resume on the trainer's thread)
change what the policy server samples: into the in-process local engine, and from disk into the local engine or
a real vLLM through the dev endpoints. Sampled logprobs after a sync must be the new weights' teacher-forced ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.engine import LocalEngine, SamplingParams
from trainer.rl.weight_sync import (
    GatedTransfer,
    LocalEngineTransfer,
    ReloadFromDiskTransfer,
    WeightSyncError,
)

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
TOLERANCE = {"local": 1e-5, "vllm": 1e-4}  # vLLM's fp32 CPU kernels agree with transformers to ~1e-6
REQUEST_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def perturbed(tiny_model_dir: Path):
    """The tiny model with every weight moved by half its spread: what a (large) training step would publish."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator) * 0.5 * weight.std().clamp(min=1e-3))
    return model


def sync_like_trl(transfer, model) -> None:
    """One sync as `AsyncGRPOTrainer._sync_weight_merged` makes it, on the calling (trainer's) thread."""
    transfer.init_weight_transfer()
    transfer.pause()
    transfer.send_weights((name, param.detach()) for name, param in model.named_parameters())
    transfer.resume()


async def complete(http: aiohttp.ClientSession, **overrides) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 16, "seed": 3, "return_token_ids": True, "logprobs": 1} | overrides
    async with http.post("/v1/completions", json=body) as response:
        payload = await response.json()
        assert response.status == 200, payload
        return payload["choices"][0]


def assert_sampled_by(model, choice: dict, tolerance: float) -> None:
    expected = teacher_forced_logprobs(model, PROMPT, choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=tolerance)


async def test_local_engine_transfer_serves_the_new_weights_and_bumps_the_version(http, engine, perturbed):
    before = await complete(http)
    transfer = LocalEngineTransfer(engine, loop=asyncio.get_running_loop())

    await asyncio.to_thread(sync_like_trl, transfer, perturbed)

    after = await complete(http)
    assert (engine.weight_version, engine.is_paused) == (1, False)
    assert after["token_ids"] != before["token_ids"]
    assert_sampled_by(perturbed, after, TOLERANCE["local"])


class RecordingGate:
    """Stands in for `interceptor.InterceptionServer`: records its calls and the engine's state at each."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.calls: list[tuple] = []
        self.inflight_at_pause = 0

    async def pause(self) -> None:
        self.inflight_at_pause = self.engine.core.active_requests
        self.calls.append(("pause", self.engine.is_paused, self.engine.weight_version))

    async def resume(self, *, policy_version: int | None = None) -> None:
        self.calls.append(("resume", policy_version, self.engine.is_paused, self.engine.weight_version))


async def test_gate_is_closed_around_the_swap_and_inflight_generations_finish(engine, perturbed):
    loop = asyncio.get_running_loop()
    gate = RecordingGate(engine)
    transfer = GatedTransfer(LocalEngineTransfer(engine, loop=loop), gate=gate, loop=loop)
    inflight = engine.core.start(PROMPT, SamplingParams(max_tokens=200, seed=1, ignore_eos=True))
    await anext(inflight.events())  # it holds a batch row when the sync starts

    await asyncio.to_thread(sync_like_trl, transfer, perturbed)

    # Closed before the engine pauses; opened after it resumed on the new weights, with the new policy version.
    assert gate.calls == [("pause", False, 0), ("resume", 1, False, 1)]
    assert gate.inflight_at_pause == 1
    assert (await inflight.result()).finish_reason == "length"  # frozen during the swap, not aborted


async def test_a_sync_called_on_the_engines_own_loop_raises_instead_of_deadlocking(engine):
    transfer = LocalEngineTransfer(engine, loop=asyncio.get_running_loop())
    with pytest.raises(WeightSyncError, match="another thread"):
        transfer.pause()
    assert not engine.is_paused


async def test_reload_from_disk_into_the_local_engine(http, engine, perturbed, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    before = await complete(http)
    transfer = ReloadFromDiskTransfer(
        base_url=engine.base_url, weights_dir=tmp_path / "policy", config_dir=tiny_model_dir
    )

    await asyncio.to_thread(sync_like_trl, transfer, perturbed)

    after = await complete(http)
    assert (engine.weight_version, engine.is_paused) == (1, False)
    assert after["token_ids"] != before["token_ids"]
    assert_sampled_by(perturbed, after, TOLERANCE["local"])
    # The directory is a complete checkpoint of what was sent.
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "policy", dtype=torch.float32)
    for (name, sent), (_, loaded) in zip(perturbed.named_parameters(), saved.named_parameters(), strict=True):
        assert torch.equal(sent, loaded), name


@pytest.fixture
async def vllm_http(vllm_server) -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(base_url=vllm_server.base_url, timeout=timeout) as session:
        yield session


@pytest.mark.vllm
async def test_reload_from_disk_into_vllm(vllm_http, vllm_server, perturbed, reference_model, tmp_path):
    before = await complete(vllm_http)
    transfer = ReloadFromDiskTransfer(
        base_url=vllm_server.base_url, weights_dir=tmp_path / "policy", config_dir=vllm_server.model_dir
    )
    try:
        await asyncio.to_thread(sync_like_trl, transfer, perturbed)
        after = await complete(vllm_http)
    finally:
        # The server is shared by the whole session: back to the original weights and weights path.
        await restore_original_weights(vllm_http, vllm_server.model_dir)
    restored = await complete(vllm_http)

    assert after["token_ids"] != before["token_ids"]
    assert_sampled_by(perturbed, after, TOLERANCE["vllm"])
    assert restored["token_ids"] == before["token_ids"]
    assert_sampled_by(reference_model, restored, TOLERANCE["vllm"])


async def restore_original_weights(http: aiohttp.ClientSession, model_dir: Path) -> None:
    await post(http, "/pause", mode="keep")
    try:
        await post(http, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}})
    finally:
        await post(http, "/resume")


async def post(http: aiohttp.ClientSession, path: str, body: dict | None = None, **params: str) -> None:
    async with http.post(path, json=body, params=params) as response:
        assert response.status == 200, f"POST {path} -> {response.status}: {await response.text()}"


async def test_a_turn_generated_across_a_sync_is_stamped_as_spanning_it(engine, perturbed, tiny_model_dir):
    """A turn is stamped with the version its generation started on. One that a sync paused (vLLM's "keep") and
    finished on the new weights holds tokens of both versions: it is marked `spans_sync`; turns wholly before or
    after a sync are not."""
    from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

    loop = asyncio.get_running_loop()
    config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=tiny_model_dir,
                          max_model_len=2048)
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as client:
        transfer = GatedTransfer(LocalEngineTransfer(engine, loop=loop), gate=server, loop=loop)
        before, spanning, after = (server.open_rollout() for _ in range(3))
        reached, released = asyncio.Event(), asyncio.Event()
        original = server.policy.upstream.complete

        async def complete(**kwargs):  # the spanning turn is upstream, not yet answered, while the sync runs
            if kwargs["rollout_id"] == spanning.id:
                reached.set()
                await released.wait()
            return await original(**kwargs)

        server.policy.upstream.complete = complete

        async def chat(handle) -> None:
            body = {"model": "policy", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
            async with client.post(handle.base_url + "/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {handle.secret}"}) as response:
                assert response.status == 200, await response.text()

        await chat(before)
        in_flight = asyncio.create_task(chat(spanning))
        await reached.wait()
        await asyncio.to_thread(sync_like_trl, transfer, perturbed)
        released.set()
        await in_flight
        await chat(after)
        records = [await server.finish_rollout(h.id) for h in (before, spanning, after)]
    stamps = [[(t.policy_version, t.spans_sync) for s in r.samples for t in s.turns] for r in records]
    assert stamps == [[(0, False)], [(0, True)], [(1, False)]]
