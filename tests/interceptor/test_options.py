"""Every OpenAI option is honoured or refused with a 400 that names it; retries, secrets and the journal.

Through the real server and the real openai SDK, against the scripted policy server (tests/fakes.py).
"""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.store.journal import recover_journal
from tests.interceptor.test_trajectories import TOOLS, call_text, echo

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def server(scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, record_path=tmp_path / "r.jsonl"
    )
    async with InterceptionServer(config) as server:
        yield server


@pytest.fixture
async def rollout(server):
    handle = server.open_rollout()
    async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
        yield handle, client


async def test_without_tools_a_tool_call_the_model_writes_is_plain_content(rollout, scripted):
    _, client = rollout
    scripted.script(call_text("ls"))
    reply = await client.chat.completions.create(model="p", messages=USER)
    assert reply.choices[0].message.tool_calls is None
    assert "<tool_call>" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


async def test_tool_choice_none_returns_no_tool_calls(rollout, scripted):
    _, client = rollout
    scripted.script(call_text("ls"))
    reply = await client.chat.completions.create(model="p", messages=USER, tools=TOOLS, tool_choice="none")
    assert reply.choices[0].message.tool_calls is None


async def test_tool_choice_auto_returns_the_call(rollout, scripted):
    _, client = rollout
    scripted.script(call_text("ls"))
    reply = await client.chat.completions.create(model="p", messages=USER, tools=TOOLS, tool_choice="auto")
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["bash"]


@pytest.mark.parametrize(
    "option",
    [
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "bash"}}},
        {"response_format": {"type": "json_object"}},
        {"frequency_penalty": 0.5},
        {"presence_penalty": 1.0},
        {"logit_bias": {"42": 5}},
        {"reasoning_effort": "high"},
        {"stop": ["\n"]},
        {"n": 2},
        {"top_logprobs": 3},  # without logprobs: true
        {"logprobs": True, "top_logprobs": 21},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())[:60],
)
async def test_an_option_the_policy_cannot_honour_is_a_400_naming_it(rollout, scripted, option):
    _, client = rollout
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="p", messages=USER, tools=TOOLS, **option)
    assert caught.value.body["param"] == next(iter(option)) or next(iter(option)) in caught.value.body["message"]
    assert scripted.calls == []  # refused before anything was generated


async def test_logprobs_are_the_sampled_tokens_logprobs(rollout, scripted):
    _, client = rollout
    scripted.script("Hello there.")
    reply = await client.chat.completions.create(model="p", messages=USER, logprobs=True)
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(scripted.calls[0].logprobs, abs=1e-6)
    assert "".join(c.token for c in content).startswith("Hello there.")


async def test_logprobs_come_in_a_stream_too(rollout, scripted):
    _, client = rollout
    scripted.script("Hello there.")
    stream = await client.chat.completions.create(model="p", messages=USER, logprobs=True, stream=True)
    logprobs = [c.logprob async for chunk in stream for choice in chunk.choices if choice.logprobs
                for c in choice.logprobs.content or ()]
    assert logprobs == pytest.approx(scripted.calls[0].logprobs, abs=1e-6)


async def test_parallel_tool_calls_false_stops_after_the_first_call(rollout, scripted, server):
    _, client = rollout
    close = server.policy.renderer.single_token_id("</tool_call>")
    scripted.script(call_text("ls"))
    if close is None:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="p", messages=USER, tools=TOOLS, parallel_tool_calls=False)
        return
    await client.chat.completions.create(model="p", messages=USER, tools=TOOLS, parallel_tool_calls=False)
    assert close in scripted.calls[0].body["stop_token_ids"]


async def test_unknown_fields_are_accepted_and_noted_on_the_rollout(rollout, scripted, server):
    handle, client = rollout
    await client.chat.completions.create(model="p", messages=USER, extra_body={"frobnicate": 1})
    record = await server.finish_rollout(handle.id)
    assert {"kind": "ignored_request_fields", "fields": ["frobnicate"]}.items() <= record.events[0].items()


async def test_a_numbered_sdk_retry_is_answered_from_the_record(rollout, scripted):
    _, client = rollout
    scripted.script("first")
    first = await client.chat.completions.create(model="p", messages=USER)
    again = await client.chat.completions.create(model="p", messages=USER,
                                                 extra_headers={"X-Stainless-Retry-Count": "1"})
    assert again.choices[0].message.content == first.choices[0].message.content == "first"
    assert len(scripted.calls) == 1


async def test_a_deliberate_repeat_of_a_delivered_request_is_sampled_again(rollout, scripted, server):
    handle, client = rollout
    scripted.script("first", "second")
    first = await client.chat.completions.create(model="p", messages=USER)
    again = await client.chat.completions.create(model="p", messages=USER)
    assert (first.choices[0].message.content, again.choices[0].message.content) == ("first", "second")
    record = await server.finish_rollout(handle.id)
    assert sum(len(s.turns) for s in record.samples) == 2


async def test_the_rollouts_own_secrets_never_reach_its_record(rollout, scripted, server):
    handle, client = rollout
    scripted.script(call_text("env"), "done")
    messages = [{"role": "user", "content": "run env"}]
    reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    env = f"OPENAI_API_KEY={handle.secret}\nINTERCEPTOR_TOOLS_KEY={handle.tools_secret}\n"
    messages += [echo(reply.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": env}]
    await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    async with aiohttp.ClientSession() as http:  # the answer tool, as the agent's `answer` command posts it
        async with http.post(handle.base_url + "/tools/answer", json={"answer": f"key {handle.secret}"},
                             headers={"Authorization": f"Bearer {handle.tools_secret}"}) as resp:
            assert resp.status == 200
    record = await server.finish_rollout(handle.id)
    text = (server.config.record_path).read_text()
    assert handle.secret not in text and handle.tools_secret not in text
    assert record.answer == "key [redacted]"


async def test_the_journal_rebuilds_a_live_rollout_exactly(rollout, scripted, server):
    """What recovery would write after a crash now equals what finishing writes: forks and concurrent turns too."""
    handle, client = rollout
    scripted.script(call_text("ls"), "a", "b", "title", "c")
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    messages += [echo(reply.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": "out"}]
    # two concurrent turns on the same history (the second is a copy of the branch), then a side request
    await asyncio.gather(*(client.chat.completions.create(model="p", messages=messages, tools=TOOLS,
                                                          extra_body={"seed": s}) for s in (1, 2)))
    await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "title?"}])
    edited = [messages[0], {"role": "user", "content": "compacted"}]
    await client.chat.completions.create(model="p", messages=edited, tools=TOOLS)

    (recovered,) = recover_journal(server.config.record_path)
    record = await server.finish_rollout(handle.id)
    assert recovered.status == "interrupted" and recovered.reward is None
    assert recovered.failure.cause == "interrupted"
    assert recovered.samples == record.samples
    assert recovered.trace == record.trace and recovered.forks == record.forks


async def test_deliberate_repeats_each_get_their_own_upstream_budget(rollout, scripted, server):
    handle, client = rollout
    for _ in range(server.config.upstream.attempts + 2):
        await client.chat.completions.create(model="p", messages=USER)
    assert len(scripted.calls) == server.config.upstream.attempts + 2


async def test_black_box_relays_options_the_upstream_honours_unchanged(tiny_model_dir):
    """In black_box the upstream samples, so penalties, n, stop and the like are its to honour: they go as sent."""
    from aiohttp import web

    seen: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                               "finish_reason": "stop"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        config = ServerConfig(mode="black_box", upstream=UpstreamConfig(base_url=url))
        async with InterceptionServer(config) as server:
            handle = server.open_rollout()
            async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
                options = {"frequency_penalty": 0.5, "n": 2, "stop": ["\n"], "tool_choice": "required",
                           "response_format": {"type": "json_object"}}
                reply = await client.chat.completions.create(model="m", messages=USER, tools=TOOLS, **options)
    finally:
        await runner.cleanup()
    assert reply.choices[0].message.content == "hi"
    assert {k: seen[0][k] for k in options} == options
