"""On a CUDA GPU: the local engine serves from the GPU, the torch varlen attention runs there, and two real GRPO
steps train with engine, interception server, agents and TRL on one GPU, weights going GPU to GPU in process.
Skipped without CUDA (marked `gpu`: `pytest -m gpu` runs only these)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.engine import EngineConfig, LocalEngine
from trainer.rl.precision import generator_dtype
from trainer.rl.trl_compat import varlen_attention
from trainer.train_main import TrainConfig, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-4), ("bfloat16", 0.05)])
async def test_the_local_engine_serves_from_the_gpu_with_its_own_logprobs(tiny_model_dir, dtype, tolerance):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, device="cuda", dtype=dtype)) as engine:
        model = engine.core.policy.model
        assert {p.device.type for p in model.parameters()} == {"cuda"}
        assert await generator_dtype(engine.base_url) == dtype
        async with aiohttp.ClientSession(engine.base_url) as http:
            body = {"prompt": PROMPT, "max_tokens": 8, "seed": 3, "return_token_ids": True, "logprobs": 0,
                    "prompt_logprobs": 0}
            async with http.post("/v1/completions", json=body) as response:
                payload = await response.json()
                assert response.status == 200, payload
        choice = payload["choices"][0]
        expected = teacher_forced_logprobs(model.float().cpu() if dtype == "float32" else model, PROMPT,
                                           choice["token_ids"])
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=tolerance)


def test_torch_varlen_attention_on_the_gpu_matches_attention_over_each_path():
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, heads, 8, device="cuda") for heads in (4, 2, 2))
    paths = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4], device="cuda")
    out = varlen_attention(q, k[paths], v[paths], torch.tensor([0, 3, 5]), torch.tensor([0, 3, 8]), 3, 5)
    attended = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(out[:3], attended[:3])
    torch.testing.assert_close(out[3:], attended[3:])


async def test_two_grpo_steps_on_one_gpu_update_the_served_policy(tiny_model_dir, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "parity", "instruction": "Say anything.",
                                 "grader": {"kind": "python", "callable": "tests.trainer.parity_task:grade"},
                                 "limits": {"wall_s": 60, "idle_s": 30}}) + "\n")
    agent = Path(__file__).parents[1] / "trainer" / "parity_task.py"
    config = TrainConfig(tasks=tasks, model=tiny_model_dir, agent="command", command=f"{sys.executable} {agent}",
                         out=tmp_path / "run", max_tokens=8, num_generations=4, samples_per_step=4, max_steps=2,
                         learning_rate=1e-3, concurrency=4)
    result = await train(config)
    assert result.engine_weight_version >= 3
    setup = json.loads((config.out / "setup.json").read_text())
    assert setup["engine_device"] == "cuda" and setup["trainer_dtype"] == setup["generator_dtype"]
    lines = [json.loads(line) for line in (config.out / "metrics.jsonl").read_text().splitlines()]
    assert any("logprob_gap/mean" in line for line in lines)
