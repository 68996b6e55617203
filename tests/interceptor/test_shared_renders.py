"""A GRPO group's rollouts send the same first request: the server renders and tokenizes it once for all of them,
and every rollout's sample still starts with exactly those ids."""

from __future__ import annotations

import asyncio
import math

import orjson
import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.errors import BadRequest
from interceptor.tokens.shared_renders import SharedRenders

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture
async def server(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server:
        yield server


async def test_a_group_of_rollouts_with_one_task_shares_one_render(server, scripted):
    task = [{"role": "system", "content": "You are an agent. " * 150}, {"role": "user", "content": "Fix the bug."}]
    handles = [server.open_rollout() for _ in range(8)]

    async def first_turn(handle):
        client = AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)
        await client.chat.completions.create(model="p", messages=task, tools=TOOLS)

    await asyncio.gather(*(first_turn(h) for h in handles))
    assert server.policy.renders.renders == 1
    expected = server.policy.renderer.render_full(task, TOOLS)
    for handle in handles:
        (sample,) = (await server.finish_rollout(handle.id)).samples
        (turn,) = sample.turns
        assert sample.input_ids[: turn.completion_start] == expected
        sampled = sample.input_ids[turn.completion_start: turn.completion_end]
        logprobs = sample.old_logprobs[turn.completion_start: turn.completion_end]
        assert any(  # the identical prompts were sampled 8 times: one of those calls is this sample's
            c.prompt_ids == expected and c.token_ids == sampled
            and all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(logprobs, c.logprobs))
            for c in scripted.calls
        )


async def test_a_different_tool_list_or_conversation_is_rendered_anew(server):
    renders = server.policy.renders
    messages = [{"role": "user", "content": "hi"}]
    first = await renders.render_full(messages, TOOLS, b"tools-a", off_loop=False)
    again = await renders.render_full(messages, TOOLS, b"tools-a", off_loop=True)
    assert again is first and renders.renders == 1  # immutable JSON, shared without a copy
    assert orjson.loads(first.json) == server.policy.renderer.render_full(messages, TOOLS) and first.count > 0
    without_tools = await renders.render_full(messages, None, b"", off_loop=False)
    await renders.render_full([{"role": "user", "content": "hi!"}], TOOLS, b"tools-a", off_loop=True)
    assert renders.renders == 3 and without_tools.count < first.count


async def test_a_render_the_template_refuses_fails_every_waiter_and_is_not_kept(tiny_model_dir):
    from interceptor.tokens.rendering import Renderer, RendererConfig

    template = "{{ raise_exception('no') }}"
    renders = SharedRenders(Renderer(RendererConfig(model_dir=tiny_model_dir, chat_template=template)))
    messages = [{"role": "user", "content": "hi"}]
    results = await asyncio.gather(*(renders.render_full(messages, None, b"", off_loop=True) for _ in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(r, BadRequest) for r in results)
    with pytest.raises(BadRequest):
        await renders.render_full(messages, None, b"", off_loop=False)
    assert renders.renders == 2  # the failure was shared by the three waiters, and not kept


async def test_kept_renders_are_bounded_by_their_tokens(tiny_model_dir):
    from interceptor.tokens.rendering import Renderer, RendererConfig

    renders = SharedRenders(Renderer(RendererConfig(model_dir=tiny_model_dir)), max_tokens=40)
    for i in range(10):
        await renders.render_full([{"role": "user", "content": f"message {i}"}], None, b"", off_loop=False)
    assert 0 < renders._kept_tokens <= 40
    assert renders.renders == 10
