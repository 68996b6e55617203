"""Property: whatever shape a conversation takes, every recorded sample is token-exact.

Hypothesis draws a script of agent behaviour (plain replies, tool calls, parallel calls, length cuts, retries,
compaction, edited history, dropped reasoning, side requests) and plays it through the real server against the
scripted policy; the invariants must hold for every sample of the record, and each policy call is recorded once.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import ScriptedUpstream
from tests.interceptor.test_trajectories import TOOLS, call_text, echo
from tests.invariants import assert_token_exact

REPLIES = st.sampled_from(
    [
        "plain answer",
        "<think>\nhmm\n</think>\n\nthought first",
        call_text("ls"),
        call_text("cat a.txt") + "\n" + call_text("wc -l"),
        ("length", "a very long answer that gets cut somewhere in the middle"),
        "Ünïcödé 数学 ✓",
    ]
)
ACTIONS = st.sampled_from(["continue", "continue", "continue", "retry", "compact", "edit", "drop_reasoning", "side"])


async def play(model_dir, replies, actions) -> None:
    async with ScriptedUpstream(model_dir) as upstream:
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=model_dir)
        async with InterceptionServer(config) as server:
            handle = server.open_rollout()
            async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0) as client:
                record = await converse(server, upstream, handle, client, replies, actions)
            assert_token_exact(record, upstream.calls)


async def converse(server, upstream, handle, client, replies, actions):
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    expected_calls = 0
    last_request: list[dict] | None = None
    for step, (reply, action) in enumerate(zip(replies, actions)):
        if action == "retry" and last_request is not None:
            # the SDK resends the request it already sent, numbering the retry: answered from the record, no new call
            await client.chat.completions.create(model="p", messages=last_request, tools=TOOLS,
                                                 extra_headers={"X-Stainless-Retry-Count": "1"})
            continue
        if action == "compact" and len(messages) > 4:
            messages = [messages[0], {"role": "user", "content": f"summary {step}; continue"}]
        elif action == "edit" and len(messages) > 3:
            for m in messages:
                if m["role"] == "assistant":
                    m["content"] = (m.get("content") or "") + " (edited)"
                    break
        elif action == "side":
            upstream.script("side reply")
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": f"title {step}?"}])
            expected_calls += 1
        upstream.script(reply)
        last_request = [dict(m) for m in messages]
        response = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        expected_calls += 1
        message = echo(response.choices[0].message)
        if action == "drop_reasoning":
            message.pop("reasoning_content", None)
        messages.append(message)
        calls = response.choices[0].message.tool_calls or []
        if calls:
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "out"} for c in calls]
        else:
            messages.append({"role": "user", "content": "and then?"})
    record = await server.finish_rollout(handle.id)
    assert len(upstream.calls) == expected_calls
    assert sum(len(s.turns) for s in record.samples) == expected_calls
    return record


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(REPLIES, min_size=1, max_size=8), actions=st.lists(ACTIONS, min_size=8, max_size=8))
def test_every_sample_is_token_exact_for_any_conversation_shape(tiny_model_dir, replies, actions):
    asyncio.run(play(tiny_model_dir, replies, actions))
