"""The proof that samples are token-exact, against real policy servers: vLLM (CPU build) and the local engine.

A multi-turn conversation with tools goes through the interception server (the real `openai` SDK as the agent,
streaming), including a turn cut by the length limit. Then the policy server itself scores each recorded sample:
`prompt_logprobs` over the sample's `input_ids` gives the logprob of every token given exactly the tokens before it.
At every mask-1 position that must equal the recorded `old_logprobs` (to 1e-4): the policy conditioned on exactly
those tokens and sampled them. A spliced or re-tokenized history would fail here.
"""

from __future__ import annotations

import math

import aiohttp
import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig
from tests.interceptor.test_trajectories import TOOLS
from trainer.demo import collect_message
from trainer.engine import EngineConfig, LocalEngine

async def converse(base_url: str, secret: str) -> None:
    async with AsyncOpenAI(base_url=base_url, api_key=secret, max_retries=0) as client:
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List files."}]
        for turn in range(4):
            stream = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, stream=True, max_tokens=6 if turn == 1 else 16
            )
            assistant = await collect_message(stream)
            calls = assistant.get("tool_calls", [])
            messages.append(assistant)
            if calls:
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt b.txt"} for c in calls]
            else:
                messages.append({"role": "user", "content": f"Now step {turn + 1}: run `ls -la`."})


async def prompt_logprobs(base_url: str, model: str, input_ids: list[int]) -> list[float | None]:
    """The policy server's logprob of each token of `input_ids` given the tokens before it."""
    payload = {"model": model, "prompt": input_ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base_url}/v1/completions", json=payload) as resp:
            body = await resp.json()
            assert resp.status == 200, body
    entries = body["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(input_ids)
    return [None if e is None else e[str(token)]["logprob"] for e, token in zip(entries, input_ids)]


async def run_and_check(policy_url: str, model_dir, model_name: str) -> None:
    config = ServerConfig(upstream=UpstreamConfig(base_url=policy_url), model_dir=model_dir)
    async with InterceptionServer(config) as server:
        rollout = server.open_rollout(sampling=SamplingSettings(temperature=1.0, seed=1234))
        await converse(rollout.base_url, rollout.secret)
        record = await server.finish_rollout(rollout.id)
    assert sum(len(s.turns) for s in record.samples) == 4
    assert any(t.finish_reason == "length" for s in record.samples for t in s.turns)
    checked = 0
    for sample in record.samples:
        scored = await prompt_logprobs(policy_url, model_name, sample.input_ids)
        for position, (mask, recorded) in enumerate(zip(sample.completion_mask, sample.old_logprobs)):
            if mask:
                assert math.isclose(scored[position], recorded, abs_tol=1e-4), (
                    f"sample {sample.index} position {position}: policy says {scored[position]}, recorded {recorded}"
                )
                checked += 1
    assert checked == sum(sum(s.completion_mask) for s in record.samples) > 0


@pytest.mark.vllm
async def test_samples_through_the_server_are_what_vllm_conditioned_on(vllm_server):
    await run_and_check(vllm_server.base_url, vllm_server.model_dir, str(vllm_server.model_dir))


async def test_samples_through_the_server_are_what_the_local_engine_conditioned_on(tiny_model_dir):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        await run_and_check(engine.base_url, tiny_model_dir, "tiny")


@pytest.mark.vllm
async def test_samples_from_the_real_smollm2_are_what_vllm_conditioned_on(smollm2_dir, tmp_path):
    """The same proof on a real pretrained model (SmolLM2-135M-Instruct, `make-model smollm2`), served by its own
    vLLM: its tokenizer and tool template through the gate, its sampled tokens scored where it sampled them."""
    from tests.vllm_server import require_vllm_python, start_vllm

    async with start_vllm(smollm2_dir, python=require_vllm_python(), log_dir=tmp_path) as server:
        await run_and_check(server.base_url, smollm2_dir, str(smollm2_dir))


async def test_samples_from_the_real_smollm2_are_what_the_local_engine_conditioned_on(smollm2_dir):
    async with LocalEngine(EngineConfig(model=smollm2_dir, port=0, served_model_name="smollm2")) as engine:
        await run_and_check(engine.base_url, smollm2_dir, "smollm2")
