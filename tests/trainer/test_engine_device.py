"""The local engine's device and dtype (`--device`, `--dtype`, as vLLM's): the weights are held in the dtype asked
for, `/server_info` says which (as vLLM's dev-mode endpoint does, read by `trainer.rl.precision`), the logprobs it
reports are the ones its own weights give, and a device that is not there is refused with the reason."""

from __future__ import annotations

import aiohttp
import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.engine import EngineConfig, LocalEngine
from trainer.rl.precision import dtype_mismatch, generator_dtype, trainer_dtype

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]


async def test_a_bfloat16_engine_serves_bfloat16_weights_and_says_so(tiny_model_dir):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, dtype="bfloat16")) as engine:
        model = engine.core.policy.model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert await generator_dtype(engine.base_url) == "bfloat16"
        assert await generator_dtype(engine.base_url + "/v1") == "bfloat16"
        async with aiohttp.ClientSession(engine.base_url) as http:
            body = {"prompt": PROMPT, "max_tokens": 6, "seed": 3, "return_token_ids": True, "logprobs": 0}
            async with http.post("/v1/completions", json=body) as response:
                choice = (await response.json())["choices"][0]
        sampled = choice["token_ids"]
        reported = choice["logprobs"]["token_logprobs"]
        expected = teacher_forced_logprobs(model, PROMPT, sampled)  # the same bf16 weights, one forward pass
        assert reported == pytest.approx(expected, abs=0.05)  # bf16 rounding differs between batch shapes


async def test_the_default_engine_is_float32_on_cpu_and_agrees_with_the_cpu_trainer(tiny_model_dir):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as engine:
        served = await generator_dtype(engine.base_url)
    assert served == "float32" == trainer_dtype("auto")
    assert dtype_mismatch(trainer_dtype("auto"), served) is None
    assert "--dtype bfloat16" in dtype_mismatch("bfloat16", served)


async def test_a_server_without_server_info_reports_no_dtype(scripted):
    assert await generator_dtype(scripted.url) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
async def test_a_cuda_device_on_a_machine_without_one_is_refused_with_the_reason(tiny_model_dir):
    with pytest.raises(ValueError, match="device 'cuda' asked for, but torch sees no CUDA device"):
        async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, device="cuda")):
            pass


@pytest.mark.parametrize(("field", "value", "message"), [
    ("device", "gpu", "device must be 'cpu', 'cuda' or 'cuda:N'"),
    ("device", "cuda:x", "device must be"),
    ("dtype", "float64", "dtype must be one of"),
])
def test_bad_device_or_dtype_is_refused_when_configured(tiny_model_dir, field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=tiny_model_dir, **{field: value})
