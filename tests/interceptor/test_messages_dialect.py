"""The Anthropic Messages dialect through the real server and the real `anthropic` SDK, against a scripted policy:
text, tool use loops that stay one token-exact sample, thinking, streaming (the SDK's own event accumulation),
usage, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import anthropic
import pytest
from anthropic import AsyncAnthropic

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import Fault
from tests.invariants import assert_token_exact

BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def call_text(command: str) -> str:
    return f'<tool_call>\n{{"name": "Bash", "arguments": {{"command": "{command}"}}}}\n</tool_call>'


@pytest.fixture
async def server(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server:
        yield server


def client_for(handle, **kwargs) -> AsyncAnthropic:
    """As Claude Code is configured: the rollout's base without /v1, the secret as x-api-key."""
    return AsyncAnthropic(base_url=handle.base_url.removesuffix("/v1"), api_key=handle.secret, max_retries=0, **kwargs)


def echo(message) -> dict:
    """What an agent sends back: the assistant message's content blocks as the SDK parsed them."""
    return {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}


async def test_a_text_reply_has_the_messages_shape_and_usage(server, scripted):
    handle = server.open_rollout()
    scripted.script("Hello there.")
    reply = await client_for(handle).messages.create(
        model="policy", max_tokens=64, system="You are terse.", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.type == "message" and reply.role == "assistant"
    assert [(b.type, b.text) for b in reply.content] == [("text", "Hello there.")]
    assert reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == len(scripted.calls[0].token_ids)
    assert reply.usage.input_tokens == len(scripted.calls[0].prompt_ids)
    record = await server.finish_rollout(handle.id)
    assert_token_exact(record, scripted.calls)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_tool_use_loop_is_one_token_exact_sample(server, scripted, stream):
    handle = server.open_rollout()
    client = client_for(handle)
    scripted.script(call_text("ls"), call_text("cat notes.txt"), "Done.")
    messages = [{"role": "user", "content": "look around"}]
    for _ in range(3):
        if stream:
            async with client.messages.stream(model="policy", max_tokens=32000, tools=[BASH], messages=messages) as s:
                reply = await s.get_final_message()
        else:
            # (the SDK refuses a non-streamed max_tokens above ~21000; both exceed this model's context)
            reply = await client.messages.create(model="policy", max_tokens=20000, tools=[BASH], messages=messages)
        messages.append(echo(reply))
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        assert reply.stop_reason == "tool_use"
        assert uses[0].name == "Bash" and "command" in uses[0].input
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": uses[0].id, "content": f"output of {uses[0].input['command']}"}]})
    assert reply.content[-1].text == "Done."
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [3]  # extended, never forked
    assert record.forks == 0
    assert_token_exact(record, scripted.calls)
    prompt = scripted.tokenizer.decode(scripted.calls[2].prompt_ids)
    assert "output of cat notes.txt" in prompt and "output of ls" in prompt


async def test_thinking_comes_back_as_a_thinking_block_and_the_echo_extends_the_sample(server, scripted):
    handle = server.open_rollout()
    client = client_for(handle)
    scripted.script("<think>\nthe user greets me\n</think>\n\nHi!", "Bye.")
    messages = [{"role": "user", "content": "hello"}]
    reply = await client.messages.create(model="policy", max_tokens=128, messages=messages,
                                         thinking={"type": "enabled", "budget_tokens": 1024})
    kinds = [b.type for b in reply.content]
    assert kinds == ["thinking", "text"]
    assert reply.content[0].thinking.strip() == "the user greets me"
    messages += [echo(reply), {"role": "user", "content": "bye"}]
    await client.messages.create(model="policy", max_tokens=128, messages=messages)
    record = await server.finish_rollout(handle.id)
    assert [len(s.turns) for s in record.samples] == [2]
    assert_token_exact(record, scripted.calls)
    assert any(e["kind"] == "ignored_request_fields" and "thinking" in e["fields"] for e in record.events)


async def test_the_streamed_events_are_the_ones_claude_code_reads(server, scripted):
    handle = server.open_rollout()
    scripted.script(call_text("pwd"))
    async with client_for(handle).messages.stream(model="policy", max_tokens=64, tools=[BASH],
                                                  messages=[{"role": "user", "content": "where?"}]) as stream:
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert any(d.type == "input_json_delta" for d in deltas)
    final = next(e for e in events if e.type == "message_stop").message
    assert final.content[0].type == "tool_use" and final.content[0].input == {"command": "pwd"}
    assert final.stop_reason == "tool_use"


async def test_count_tokens_is_the_rendered_prompt_length(server, scripted):
    handle = server.open_rollout()
    client = client_for(handle)
    messages = [{"role": "user", "content": "count me"}]
    counted = await client.messages.count_tokens(model="policy", messages=messages, tools=[BASH], system="terse")
    scripted.script("ok")
    reply = await client.messages.create(model="policy", max_tokens=16, messages=messages, tools=[BASH],
                                         system="terse")
    assert counted.input_tokens == reply.usage.input_tokens == len(scripted.calls[0].prompt_ids)


async def test_a_wrong_key_is_an_authentication_error_in_anthropic_shape(server):
    handle = server.open_rollout()
    client = AsyncAnthropic(base_url=handle.base_url.removesuffix("/v1"), api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await client.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"stop_sequences": ["END"]}, "stop_sequences"),
        ({"tool_choice": {"type": "any"}, "tools": [BASH]}, "tool_choice"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool type"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
         "image blocks"),
    ],
    ids=["stop_sequences", "tool_choice_any", "server_tool", "image"],
)
async def test_what_the_policy_cannot_honour_is_a_400_that_says_so(server, scripted, kwargs, param):
    handle = server.open_rollout()
    request = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(handle).messages.create(**request)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert param in caught.value.body["error"]["message"]
    assert scripted.calls == []


async def test_a_prompt_past_the_context_is_the_error_claude_code_compacts_on(server, scripted):
    handle = server.open_rollout()
    long = "word " * (server.policy.max_model_len + 10)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(handle).messages.create(model="policy", max_tokens=8,
                                                 messages=[{"role": "user", "content": long}])
    message = caught.value.body["error"]["message"]
    assert message.startswith("prompt is too long: ") and f"> {server.policy.max_model_len} maximum" in message
    assert scripted.calls == []


async def test_an_upstream_that_is_down_is_529_overloaded_and_never_a_reward(server, scripted):
    handle = server.open_rollout()
    scripted.script(Fault(status=503))
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client_for(handle).messages.create(model="policy", max_tokens=8,
                                                 messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "upstream"
