"""The OpenAI Responses dialect through the real server and the real `openai` SDK, against a scripted policy, sent
as Codex CLI sends it (`store: false`, the whole history each turn, `function_call` / `function_call_output`
items): text, tool loops that stay one token-exact sample, reasoning, streaming (the SDK's own event
accumulation), usage, and errors before and after the headers."""

from __future__ import annotations

import json

import openai
import pytest
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.gate.turn import HEAVY_REQUEST_BYTES
from tests.fakes import Fault
from tests.invariants import assert_token_exact

EXEC_COMMAND = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
CODEX = {"store": False, "tool_choice": "auto", "parallel_tool_calls": True, "include": ["reasoning.encrypted_content"],
         "prompt_cache_key": "session-1", "reasoning": {"effort": "medium", "summary": "auto"}}  # fmt: skip


def call_text(cmd: str) -> str:
    return f'<tool_call>\n{{"name": "exec_command", "arguments": {{"cmd": "{cmd}"}}}}\n</tool_call>'


def config_for(scripted, tiny_model_dir, **kwargs) -> ServerConfig:
    return ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1), model_dir=tiny_model_dir, **kwargs)


@pytest.fixture
async def server(scripted, tiny_model_dir):
    async with InterceptionServer(config_for(scripted, tiny_model_dir)) as server:
        yield server


def client_for(handle) -> AsyncOpenAI:
    """As Codex is configured: the rollout's base URL, the secret sent as a bearer token."""
    return AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def echo(response) -> list[dict]:
    """What Codex sends back: the response's output items as the SDK parsed them."""
    return [item.model_dump(exclude_none=True) for item in response.output]


async def test_a_text_reply_has_the_response_shape_and_usage(server, scripted):
    handle = server.open_rollout()
    scripted.script("Hello there.")
    response = await client_for(handle).responses.create(model="policy", instructions="You are terse.", input="hi")
    assert response.object == "response" and response.status == "completed" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "Hello there."
    assert response.usage.output_tokens == len(scripted.calls[0].token_ids)
    assert response.usage.input_tokens == len(scripted.calls[0].prompt_ids)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    record = await server.finish_rollout(handle.id)
    assert_token_exact(record, scripted.calls)
    assert "You are terse." in scripted.tokenizer.decode(scripted.calls[0].prompt_ids)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_codex_tool_loop_is_one_token_exact_sample(server, scripted, stream):
    handle = server.open_rollout()
    client = client_for(handle)
    scripted.script(call_text("ls"), call_text("cat notes.txt"), "Done.")
    items = [{"type": "message", "role": "developer", "content": "You are Codex."}, user("look around")]
    for _ in range(3):
        request = {"model": "policy", "input": items, "tools": [EXEC_COMMAND], **CODEX}
        if stream:
            async with client.responses.stream(**request) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(**request)
        assert response.status == "completed"
        items += echo(response)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        assert calls[0].name == "exec_command" and calls[0].id.startswith("fc_")
        cmd = json.loads(calls[0].arguments)["cmd"]
        items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": f"output of {cmd}"})
    assert response.output_text == "Done."
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [3]  # extended, never forked
    assert record.forks == 0
    assert_token_exact(record, scripted.calls)
    prompt = scripted.tokenizer.decode(scripted.calls[2].prompt_ids)
    assert "output of cat notes.txt" in prompt and "output of ls" in prompt
    assert any(e["kind"] == "ignored_request_fields" and "reasoning" in e["fields"] for e in record.events)


NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning sub-agents.",
             "tools": [{"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent", "strict": False,
                        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}}]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_namespace_tools_function_is_called_with_its_namespace_both_ways(server, scripted, stream):
    """Codex's sub-agent tools come as a `namespace` tool: the policy sees `multi_agent_v1.spawn_agent`, Codex gets
    a call with `namespace` and `name`, and its echo of that call extends the same sample."""
    handle = server.open_rollout()
    client = client_for(handle)
    spawn = '<tool_call>\n{"name": "multi_agent_v1.spawn_agent", "arguments": {"message": "count"}}\n</tool_call>'
    scripted.script(spawn, "Done.")
    items = [user("use a sub-agent")]
    for _ in range(2):
        request = {"model": "policy", "input": items, "tools": [EXEC_COMMAND, NAMESPACE], **CODEX}
        if stream:
            async with client.responses.stream(**request) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(**request)
        items += echo(response)
        calls = [item.model_dump() for item in response.output if item.type == "function_call"]
        if not calls:
            break
        assert (calls[0]["namespace"], calls[0]["name"]) == ("multi_agent_v1", "spawn_agent")
        items.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": '{"agent_id":"a1"}'})
    assert response.output_text == "Done."
    assert "multi_agent_v1.spawn_agent" in scripted.tokenizer.decode(scripted.calls[0].prompt_ids)
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [2]  # the echo matched: extended, never forked
    assert_token_exact(record, scripted.calls)


async def test_the_developer_item_is_the_system_prompt(server, scripted):
    handle = server.open_rollout()
    scripted.script("ok")
    await client_for(handle).responses.create(
        model="policy", input=[{"role": "developer", "content": "Obey the sandbox."}, user("hi")]
    )
    prompt = scripted.tokenizer.decode(scripted.calls[0].prompt_ids)
    assert "system\nObey the sandbox." in prompt
    assert prompt.index("Obey the sandbox.") < prompt.index("hi")


async def test_reasoning_comes_back_as_a_reasoning_item_and_the_echo_extends_the_sample(server, scripted):
    handle = server.open_rollout()
    client = client_for(handle)
    scripted.script("<think>\nthe user greets me\n</think>\n\nHi!", "Bye.")
    items = [user("hello")]
    response = await client.responses.create(model="policy", input=items)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].summary[0].text.strip() == "the user greets me"
    items += echo(response) + [user("bye")]
    await client.responses.create(model="policy", input=items)
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [2]
    assert_token_exact(record, scripted.calls)


async def test_the_streamed_events_are_numbered_and_end_with_the_whole_response(server, scripted):
    handle = server.open_rollout()
    scripted.script("<think>\nlook first\n</think>\n\nLooking." + call_text("pwd"))
    stream = await client_for(handle).responses.create(model="policy", input="where?", tools=[EXEC_COMMAND],
                                                       stream=True)  # fmt: skip
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.reasoning_summary_text.delta", "response.output_text.delta",
                 "response.function_call_arguments.done", "response.content_part.done"):  # fmt: skip
        assert kind in kinds
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    assert [item.type for item in done] == [item.type for item in final.output] == ["reasoning", "message",
                                                                                    "function_call"]  # fmt: skip
    assert json.loads(final.output[2].arguments) == {"cmd": "pwd"}
    assert final.usage.output_tokens == len(scripted.calls[0].token_ids)


async def test_a_reply_cut_by_length_is_incomplete(server, scripted):
    handle = server.open_rollout()
    scripted.script(("length", "a long story that goes on"))
    response = await client_for(handle).responses.create(model="policy", input="tell me", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tool type 'web_search'"),
        ({"tool_choice": "required", "tools": [EXEC_COMMAND]}, "tool_choice"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
         "input_image"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "item type 'web_search_call'"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"tools": [{**NAMESPACE, "name": "multi.agent"}]}, "a namespace tool needs a name"),
        ({"tools": [{**NAMESPACE, "tools": [{"type": "web_search"}]}]}, "tool type 'web_search'"),
    ],
    ids=["previous_response_id", "web_search", "tool_choice_required", "input_image", "unknown_item", "json",
         "namespace_name", "namespace_builtin"],
)
async def test_what_the_policy_cannot_honour_is_a_400_that_says_so(server, scripted, kwargs, param):
    handle = server.open_rollout()
    request = {"model": "policy", "input": "hi", **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        await client_for(handle).responses.create(**request)
    assert caught.value.body["type"] == "invalid_request_error"
    assert param in caught.value.body["message"]
    assert scripted.calls == []


async def test_a_prompt_past_the_context_is_context_length_exceeded(server, scripted):
    handle = server.open_rollout()
    long = "word " * (server.policy.max_model_len + 10)
    with pytest.raises(openai.BadRequestError) as caught:
        await client_for(handle).responses.create(model="policy", input=long)
    assert caught.value.code == "context_length_exceeded"
    assert scripted.calls == []


async def test_a_failure_after_the_headers_is_a_response_failed_event(scripted, tiny_model_dir):
    async with InterceptionServer(config_for(scripted, tiny_model_dir, stream_hold_s=0.0)) as server:
        handle = server.open_rollout()
        # past HEAVY_REQUEST_BYTES the prompt is planned in a worker thread, so the (zero) hold ends first
        long = "word " * max(server.policy.max_model_len + 10, HEAVY_REQUEST_BYTES // 4)
        stream = await client_for(handle).responses.create(model="policy", input=long, stream=True)
        events = [event async for event in stream]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].response.status == "failed" and events[-1].response.id == events[0].response.id
    assert events[-1].response.error.code == "context_length_exceeded"
    assert scripted.calls == []


async def test_an_upstream_that_is_down_is_an_error_and_never_a_reward(server, scripted):
    handle = server.open_rollout()
    scripted.script(Fault(status=503))
    with pytest.raises(openai.APIStatusError) as caught:
        await client_for(handle).responses.create(model="policy", input="hi")
    assert caught.value.status_code >= 500
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "upstream"


def turn_metadata(kind: str) -> dict:
    """Codex's client_metadata, with the request kind it puts in x-codex-turn-metadata."""
    return {"x-codex-turn-metadata": json.dumps({"request_kind": kind, "turn_id": "t1"}), "session_id": "s1"}


async def test_a_codex_compaction_request_is_its_own_sample_with_its_reason_and_never_spliced(
    server, scripted
):
    """Codex compacts through the same endpoint: the whole history plus a summary prompt, without tools. That
    request is a side request: it starts its own (auxiliary) sample whose fork reason says so, and the history that
    continues from the summary is a new sample as well; nothing is spliced into the first."""
    handle = server.open_rollout()
    client = client_for(handle)
    scripted.script(call_text("ls"), "Summary: listed the files.", "Done.")
    history = [user("look around")]
    first = await client.responses.create(model="policy", input=history, tools=[EXEC_COMMAND], **CODEX,
                                          extra_body={"client_metadata": turn_metadata("turn")})
    history += echo(first)
    history.append({"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "a.txt"})
    await client.responses.create(model="policy", input=[*history, user("Summarise the conversation so far.")],
                                  **CODEX, extra_body={"client_metadata": turn_metadata("compaction")})
    await client.responses.create(model="policy", input=[user("Summary: listed the files."), user("go on")],
                                  tools=[EXEC_COMMAND], **CODEX,
                                  extra_body={"client_metadata": turn_metadata("turn")})
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [1, 1, 1]
    compaction = record.samples[1]
    assert compaction.auxiliary and compaction.fork_reason.startswith("compaction request")
    assert not record.samples[2].auxiliary and record.samples[2].fork_reason  # the rewritten history forks
    notes = [(e["request_kind"], e["extended"]) for e in record.events if e["kind"] == "side_request"]
    assert notes == [("compaction", False)]
    assert_token_exact(record, scripted.calls)
    assert not any(e["kind"] == "ignored_request_fields" and "client_metadata" in e["fields"] for e in record.events)
