"""Conversation shapes agents produce, through the real server and the real openai SDK, against a scripted policy.

For each shape the record must hold DESIGN.md's invariants: every mask-1 token is a token the policy sampled given
exactly the tokens before it (checked against every call the policy server saw), mask-0 tokens carry logprob 0.0,
and the arrays line up. Forks happen where the history stops being an extension, and only there.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.gate.trajectory import Trajectory
from tests.invariants import assert_token_exact

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


def call_text(cmd: str) -> str:
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"cmd": "{cmd}"}}}}\n</tool_call>'


@pytest.fixture
async def server(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server:
        yield server


@pytest.fixture
def rollout(server):
    handle = server.open_rollout()
    return handle, AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)


def echo(message) -> dict:
    """What an agent sends back: the assistant message as the SDK parsed it."""
    return message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call"})


async def test_single_turn_is_one_sample_with_the_sampled_tokens(server, rollout, scripted):
    handle, client = rollout
    scripted.script("Hello there.")
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello there."
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1 and len(record.samples[0].turns) == 1
    assert record.samples[0].completion_tokens == len(scripted.calls[0].token_ids)
    assert_token_exact(record, scripted.calls)


async def test_tool_loop_of_many_turns_stays_one_sample_and_sends_only_suffixes(server, rollout, scripted):
    handle, client = rollout
    turns = 12
    scripted.script(*[call_text(f"echo {i}") for i in range(turns)], "all done")
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "run things"}]
    for i in range(turns + 1):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(echo(message))
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"out {i}"})
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1
    assert len(record.samples[0].turns) == turns + 1
    # every call's prompt starts with the previous call's prompt and sampled tokens: no re-tokenized history
    for before, after in zip(scripted.calls, scripted.calls[1:]):
        assert after.prompt_ids[: len(before.prompt_ids) + len(before.token_ids)] == before.prompt_ids + before.token_ids
    assert_token_exact(record, scripted.calls)


async def test_parallel_tool_calls_come_back_as_one_turn(server, rollout, scripted):
    handle, client = rollout
    scripted.script(call_text("ls") + "\n" + call_text("pwd"), "two results")
    messages = [{"role": "user", "content": "look around"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    calls = reply.choices[0].message.tool_calls
    assert [c.function.arguments for c in calls] == ['{"cmd": "ls"}', '{"cmd": "pwd"}']
    messages.append(echo(reply.choices[0].message))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result of {c.id}"} for c in calls]
    await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1 and len(record.samples[0].turns) == 2
    assert_token_exact(record, scripted.calls)


async def test_turn_cut_by_length_is_closed_with_an_unsampled_end_of_turn(server, rollout, scripted):
    handle, client = rollout
    scripted.script(("length", "this answer goes on and on and on"), "short")
    messages = [{"role": "user", "content": "talk"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=5)
    assert reply.choices[0].finish_reason == "length"
    messages += [echo(reply.choices[0].message), {"role": "user", "content": "go on"}]
    await client.chat.completions.create(model="policy", messages=messages)
    record = await server.finish_rollout(handle.id)
    sample = record.samples[0]
    first, second = sample.turns
    end_of_turn = scripted.end_of_turn
    assert sample.input_ids[first.completion_end] == end_of_turn  # closed as the template closes a turn
    assert sample.completion_mask[first.completion_end] == 0
    assert_token_exact(record, scripted.calls)


@pytest.mark.parametrize("agent_echoes_reasoning", [True, False])
async def test_reasoning_echoed_back_or_dropped_still_extends(server, rollout, scripted, agent_echoes_reasoning):
    handle, client = rollout
    scripted.script("<think>\nThe user wants a listing.\n</think>\n\n" + call_text("ls"), "done")
    messages = [{"role": "user", "content": "list"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == "The user wants a listing."
    echoed = echo(message)
    if not agent_echoes_reasoning:
        echoed.pop("reasoning_content")
    messages += [echoed, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "a b"}]
    await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1, "dropping reasoning is not a history rewrite: the sampled ids are kept"
    assert_token_exact(record, scripted.calls)


async def test_content_as_parts_and_unicode_render_like_strings(server, rollout, scripted):
    handle, client = rollout
    scripted.script("Ответ: 数学 ✓ café", "ok")
    parts = [{"type": "text", "text": "Привет, 数学?"}, {"type": "text", "text": "naïve → ✓"}]
    messages = [{"role": "user", "content": parts}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    assert reply.choices[0].message.content == "Ответ: 数学 ✓ café"
    messages += [echo(reply.choices[0].message), {"role": "user", "content": [{"type": "text", "text": "ещё"}]}]
    await client.chat.completions.create(model="policy", messages=messages)
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1
    text = scripted.tokenizer.decode(scripted.calls[0].prompt_ids)
    assert "Привет, 数学?\nnaïve → ✓" in text
    assert_token_exact(record, scripted.calls)


async def test_sdk_retry_is_answered_from_the_record_not_generated_again(server, rollout, scripted):
    handle, client = rollout
    scripted.script("first answer", "second answer")
    messages = [{"role": "user", "content": "hello"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    again = await client.chat.completions.create(
        model="policy", messages=messages, extra_headers={"x-stainless-retry-count": "1"}
    )
    assert again.choices[0].message.content == first.choices[0].message.content == "first answer"
    assert len(scripted.calls) == 1
    record = await server.finish_rollout(handle.id)
    assert len(record.samples[0].turns) == 1
    assert any(e["kind"] == "retry_answered_from_record" for e in record.events)


async def test_compaction_rewriting_history_forks_a_new_sample(server, rollout, scripted):
    handle, client = rollout
    scripted.script(call_text("ls"), "summary so far", "continuing")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "work"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    messages += [echo(reply.choices[0].message)]
    messages.append({"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id, "content": "x"})
    await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    compacted = [messages[0], {"role": "user", "content": "Summary: listed files. Continue."}]
    await client.chat.completions.create(model="policy", messages=compacted, tools=TOOLS)
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [2, 1]
    assert record.samples[1].fork_reason is not None
    assert not any(s.auxiliary for s in record.samples), "compaction keeps the system prompt and tools"
    assert_token_exact(record, scripted.calls)


async def test_title_request_beside_the_main_conversation_is_an_auxiliary_sample(server, rollout, scripted):
    handle, client = rollout
    scripted.script(call_text("ls"), "A short title", "done")
    main = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list files"}]
    title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "list files"}]
    first, _ = await asyncio.gather(
        client.chat.completions.create(model="policy", messages=main, tools=TOOLS),
        client.chat.completions.create(model="policy", messages=title),
    )
    main += [echo(first.choices[0].message)]
    main.append({"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": "a"})
    await client.chat.completions.create(model="policy", messages=main, tools=TOOLS)
    record = await server.finish_rollout(handle.id)
    by_turns = sorted(record.samples, key=lambda s: len(s.turns))
    assert [len(s.turns) for s in by_turns] == [1, 2]
    assert by_turns[0].auxiliary and not by_turns[1].auxiliary
    assert_token_exact(record, scripted.calls)


async def test_edited_assistant_message_is_not_spliced(server, rollout, scripted):
    handle, client = rollout
    scripted.script("the real answer", "next")
    messages = [{"role": "user", "content": "q"}]
    await client.chat.completions.create(model="policy", messages=messages)
    messages += [{"role": "assistant", "content": "an answer the model never wrote"}, {"role": "user", "content": "?"}]
    await client.chat.completions.create(model="policy", messages=messages)
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 2
    assert "assistant" in record.samples[1].fork_reason
    assert_token_exact(record, scripted.calls)


async def test_malformed_tool_call_is_returned_as_text_and_flagged(server, rollout, scripted):
    handle, client = rollout
    broken = '<tool_call>\n{"name": "bash", "arguments": {"cmd": \n</tool_call>'
    scripted.script(broken)
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == broken
    record = await server.finish_rollout(handle.id)
    assert record.samples[0].turns[0].malformed_tool_call


async def _tool_loop_prompts(server, scripted, *, reserialise_from: int) -> tuple[list[list[int]], list[dict]]:
    """A tool loop whose agent re-serialises the call's arguments from turn `reserialise_from` on (`{"cmd":"x"}`:
    the same call, another dict); the prompts the policy saw and each assistant message `closing_turns` rendered."""
    renderer = server.policy.renderer
    rendered: list[dict] = []
    closing_turns = renderer.closing_turns

    def spy(**kwargs):
        rendered.append(kwargs["last_assistant"])
        return closing_turns(**kwargs)

    renderer.closing_turns = spy
    handle = server.open_rollout()
    client = AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)
    scripted.script(*[call_text(f"echo {i}") for i in range(4)], "done")
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "run things"}]
    for i in range(5):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = echo(reply.choices[0].message)
        if i >= reserialise_from and message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            function["arguments"] = function["arguments"].replace(": ", ":")
        messages.append(message)
        if reply.choices[0].message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": f"out {i}"})
        await asyncio.sleep(0)  # the answer is out: what the next turn needs is readied now
    record = await server.finish_rollout(handle.id)
    assert len(record.samples) == 1 and len(record.samples[0].turns) == 5
    assert_token_exact(record, scripted.calls)
    return [c.prompt_ids for c in scripted.calls], rendered


async def test_the_end_of_turn_count_readied_after_an_answer_serves_an_unchanged_echo_only(
    scripted, tiny_model_dir, monkeypatch
):
    """With suffixes rendered through the template (a template `suffix_writer.py` does not write for)."""
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          suffix_writer=False)
    async with InterceptionServer(config) as server:
        readied, rendered = await _tool_loop_prompts(server, scripted, reserialise_from=2)
    # Readied once per answer, for the message returned; the echoes whose arguments come back with other bytes
    # (turns 3 and 4 extend after them) are rendered again on the turn's path, as the agent sent them.
    assert len(rendered) == 5 + 2
    assert sum(m["tool_calls"][0]["function"]["arguments"] == '{"cmd":"echo 2"}' for m in rendered if m.get("tool_calls")) == 1
    scripted.calls.clear()
    monkeypatch.setattr(Trajectory, "prepare_next", lambda self, branch, tools: None)
    async with InterceptionServer(config) as server:
        unreadied, rendered = await _tool_loop_prompts(server, scripted, reserialise_from=2)
    assert len(rendered) == 4  # nothing readied: every extending turn renders its own count
    assert readied == unreadied


async def test_written_suffixes_need_no_end_of_turn_count_and_give_the_templates_prompts(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          suffix_writer=False)
    async with InterceptionServer(config) as server:
        rendered_prompts, _ = await _tool_loop_prompts(server, scripted, reserialise_from=2)
    scripted.calls.clear()
    async with InterceptionServer(replace(config, suffix_writer=True)) as server:
        assert server.policy.renderer.suffix_writer == "qwen3"
        written_prompts, counted = await _tool_loop_prompts(server, scripted, reserialise_from=2)
        assert server.policy.renderer.suffix_mismatches == 0
    assert counted == []  # no end-of-turn count, readied or on a turn's path
    assert written_prompts == rendered_prompts
