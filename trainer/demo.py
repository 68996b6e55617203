"""`interceptor demo`: the whole path on the embedded default, on one CPU, with nothing downloaded.

1. builds the tiny Qwen3 model (random weights, real chat template) unless it exists;
2. serves it with the local engine (vLLM's /v1/completions contract);
3. puts the interception server in front, opens a rollout, and plays a small agent over the OpenAI SDK
   (streaming, with a tool): each chat call becomes a token-level generation;
4. submits an answer to the rollout's `tools/answer` endpoint, finishes the rollout (written to disk first) and
   prints what was recorded: samples, tokens with their masks, logprobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import aiohttp
from openai import AsyncOpenAI

from interceptor import SamplingSettings
from interceptor.tools.inspect import show_rollout, summarise

from trainer.models.tiny_model import make_tiny_model
from trainer.policy_stack import PolicyStack, StackConfig

__all__ = ["collect_message", "run_demo_from_args"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        },
    }
]


async def collect_message(stream) -> dict:
    """The assistant message an OpenAI SDK stream adds up to, as an agent sends it back (tool calls by index)."""
    content, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ]
    return message


async def _play_agent(base_url: str, secret: str, turns: int) -> list[str]:
    """A minimal agent: asks, runs any tool call it gets back, and stops when the model answers in text."""
    shown = []
    async with AsyncOpenAI(base_url=base_url, api_key=secret) as client:
        messages = [
            {"role": "system", "content": "You are a careful assistant. Use the calculator."},
            {"role": "user", "content": "What is 2 + 3?"},
        ]
        for _ in range(turns):
            stream = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, stream=True, max_tokens=24
            )
            assistant = await collect_message(stream)
            calls = assistant.get("tool_calls", [])
            shown.append(assistant["content"] or f"(tool calls: {[c['function']['name'] for c in calls]})")
            messages.append(assistant)
            if calls:
                messages += [{"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in calls]
            else:
                messages.append({"role": "user", "content": "Check it once more, then answer."})
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{base_url}/tools/answer", json={"answer": "5"}, headers={"Authorization": f"Bearer {secret}"}
        ) as resp:
            shown.append(f"answer tool said: {await resp.text()}")
    return shown


async def run_demo(workdir: Path, *, turns: int) -> int:
    started = time.perf_counter()
    model_dir = workdir / "model"
    if not (model_dir / "config.json").is_file():
        print(f"building the tiny model in {model_dir} ...", flush=True)
        await asyncio.to_thread(make_tiny_model, model_dir)
    record_path = workdir / "rollouts.jsonl"
    config = StackConfig(model=model_dir, build_local_model=False, served_model_name="tiny", record_path=record_path)
    async with PolicyStack(config) as stack:
        server = stack.server
        print(f"local engine serving {model_dir} at {stack.engine.base_url}", flush=True)
        rollout = server.open_rollout(sampling=SamplingSettings(temperature=1.0, seed=0))
        print(f"rollout {rollout.id} at {rollout.base_url}", flush=True)
        for number, text in enumerate(await _play_agent(rollout.base_url, rollout.secret, turns)):
            print(f"  turn {number}: {text[:100]!r}")
        record = await server.finish_rollout(rollout.id)
    print()
    print(json.dumps(summarise([record]), indent=2))
    print()
    print(show_rollout(record, decode=None))
    sample = record.samples[0]
    first = sample.turns[0]
    print()
    print(f"first sampled tokens: {sample.input_ids[first.completion_start:first.completion_start + 8]}")
    print(f"their logprobs:       {[round(x, 4) for x in sample.old_logprobs[first.completion_start:first.completion_start + 8]]}")
    print(f"recorded to {record_path} (inspect it with: interceptor inspect {record_path} --rollout {record.rollout_id}"
          f" --model {model_dir})")
    print(f"demo finished in {time.perf_counter() - started:.1f}s")
    return 0


def run_demo_from_args(args: argparse.Namespace) -> int:
    return asyncio.run(run_demo(Path(args.workdir), turns=args.turns))
