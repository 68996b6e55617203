"""The real `openai` SDK, sync and async, streaming and not, against the server on port 0 in front of the local
engine (interception_gate) and relaying to the engine's chat endpoint (black_box)."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI, OpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.interceptor.test_trajectories import TOOLS, call_text
from trainer.engine import EngineConfig, LocalEngine

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture
async def engine(tiny_model_dir):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        yield engine


@pytest.fixture(params=["interception_gate", "black_box"])
async def server(request, engine, tiny_model_dir):
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=engine.base_url, model="tiny"), model_dir=tiny_model_dir, mode=request.param
    )
    async with InterceptionServer(config) as server:
        yield server


async def test_async_client_plain_and_streamed(server):
    handle = server.open_rollout()
    async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
        plain = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=1)
        assert plain.choices[0].finish_reason in ("stop", "length")
        assert plain.usage.completion_tokens >= 1
        stream = await client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("stop", "length")
    record = await server.finish_rollout(handle.id)
    assert len(record.trace) == 2
    assert record.usage["completion_tokens"] >= 2
    if server.config.mode == "interception_gate":
        assert sum(len(s.turns) for s in record.samples) == 2
    else:
        assert record.samples == [] and record.trace[1]["response"]["role"] == "assistant"


async def test_sync_client_plain_and_streamed(server):
    handle = server.open_rollout()

    def talk() -> tuple[str, str]:
        with OpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
            plain = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6)
            streamed = "".join(
                chunk.choices[0].delta.content or ""
                for chunk in client.chat.completions.create(
                    model="policy", messages=MESSAGES, max_tokens=6, stream=True, seed=3
                )
                if chunk.choices
            )
        return plain.choices[0].message.content or "", streamed

    plain, streamed = await asyncio.to_thread(talk)  # the server runs on this test's event loop
    assert isinstance(plain, str) and isinstance(streamed, str)
    record = await server.finish_rollout(handle.id)
    assert len(record.trace) == 2


async def test_tool_calls_accumulate_from_stream_deltas(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    scripted.script("Let me look.\n" + call_text("ls -la") + "\n" + call_text("pwd"))
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret) as client:
            stream = await client.chat.completions.create(model="p", messages=MESSAGES, tools=TOOLS, stream=True)
            calls: dict[int, dict] = {}
            content, finish = "", None
            async for chunk in stream:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
                for call in delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
    assert content == "Let me look."
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("bash", '{"cmd": "ls -la"}'),
        ("bash", '{"cmd": "pwd"}'),
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


async def test_openai_sdk_streams_through_keepalive_comments(scripted, tiny_model_dir):
    from tests.fakes import Slow

    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, keepalive_s=0.2,
                          stream_hold_s=0.2)
    scripted.script(Slow("after a long think", delay_s=1.0))
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
            stream = await client.chat.completions.create(model="p", messages=MESSAGES, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "after a long think"
