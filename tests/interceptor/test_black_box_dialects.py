"""black_box relays of Anthropic Messages and OpenAI Responses, through the real server and the real `anthropic` and
`openai` SDKs, to a fake upstream that speaks both dialects (a real aiohttp app on port 0): the reply reaches the
agent unchanged, the upstream sees the server's key and model, the trace holds the turn in the internal form, and
an upstream failure (an error status, a stream broken off) is answered in the dialect's shape and not rewarded."""

from __future__ import annotations

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.faults.conftest import SERVER_DEFAULTS, UPSTREAM_DEFAULTS

SERVER_KEY = "sk-upstream-server-key"
UPSTREAM_MODEL = "upstream-model"
BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
FUNCTION = {"type": "function", "name": "Bash", "parameters": BASH["input_schema"]}
USER = {"role": "user", "content": "list the files"}

# The upstream's answers, as the real APIs write them.
MESSAGES_TEXT = [{"type": "text", "text": "Hello from upstream."}]
MESSAGES_TOOL = [
    {"type": "thinking", "thinking": "I should list them.", "signature": "c2ln"},
    {"type": "text", "text": "Let me look."},
    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}},
]
TEXT_PART = {"type": "output_text", "text": "Hello from upstream.", "annotations": []}
RESPONSES_TEXT = [{"type": "message", "id": "msg", "role": "assistant", "status": "completed", "content": [TEXT_PART]}]
RESPONSES_TOOL = [
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should list them."}]},
    *RESPONSES_TEXT,
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "Bash", "arguments": '{"command":"ls"}',
     "status": "completed"},
]  # fmt: skip
# ...and what the trace records of them, in the internal OpenAI-style form.
TEXT_RECORDED = {"role": "assistant", "content": "Hello from upstream."}
CALL_RECORDED = {"id": "toolu_01", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
TOOL_RECORDED = {"role": "assistant", "content": "Let me look.", "reasoning_content": "I should list them.",
                 "tool_calls": [CALL_RECORDED]}  # fmt: skip


class DialectUpstream:
    """Answers /v1/messages and /v1/responses with `then`: "text", "tool", an error status, or "break" (a stream cut
    off after its first events). Keeps every request's headers and body, and every byte of every answer."""

    def __init__(self) -> None:
        self.then: str | int = "text"
        self.cookie: str | None = None  # set on every JSON answer when given (a session cookie of the upstream's)
        self.requests: list[tuple[dict, dict]] = []  # (headers, body)
        self.sent: list[bytes] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> DialectUpstream:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/responses", self._responses)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    async def _take(self, request: web.Request) -> dict:
        body = await request.json()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        return body

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request)
        if isinstance(self.then, int):
            kind = "overloaded_error" if self.then == 529 else "api_error"
            return self._json({"type": "error", "error": {"type": kind, "message": "upstream trouble"}}, self.then)
        blocks = MESSAGES_TOOL if self.then == "tool" else MESSAGES_TEXT
        message = {"id": "msg_up", "type": "message", "role": "assistant", "model": body["model"], "content": blocks,
                   "stop_reason": "tool_use" if self.then == "tool" else "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": 21, "output_tokens": 9}}  # fmt: skip
        if not body.get("stream"):
            return self._json(message)
        return await self._stream(request, _messages_events(message))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request)
        if isinstance(self.then, int):
            return self._json({"error": {"message": "upstream trouble", "type": "server_error"}}, self.then)
        response = {"id": "resp_up", "object": "response", "created_at": 1, "status": "completed", "error": None,
                    "incomplete_details": None, "model": body["model"], "parallel_tool_calls": True,
                    "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
                    "output": RESPONSES_TOOL if self.then == "tool" else RESPONSES_TEXT,
                    "usage": {"input_tokens": 21, "output_tokens": 9, "total_tokens": 30}}  # fmt: skip
        if not body.get("stream"):
            return self._json(response)
        return await self._stream(request, _responses_events(response))

    def _json(self, body: dict, status: int = 200) -> web.Response:
        raw = orjson.dumps(body)
        self.sent.append(raw)
        response = web.Response(body=raw, status=status, content_type="application/json")
        if self.cookie:
            response.set_cookie("upstream_session", self.cookie)
        return response

    async def _stream(self, request: web.Request, events: list[tuple[str, dict]]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent = b""
        for i, (name, data) in enumerate(events):
            chunk = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            if self.then == "break" and i == 3:
                await response.write(chunk[: len(chunk) // 2])
                request.transport.close()  # the upstream breaks off mid-event: no end chunk
                self.sent.append(sent + chunk[: len(chunk) // 2])
                return response
            await response.write(chunk)
            sent += chunk
        await response.write_eof()
        self.sent.append(sent)
        return response


def _messages_events(message: dict) -> list[tuple[str, dict]]:
    start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 21, "output_tokens": 1}}
    events = [("message_start", {"message": start})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            opened, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": t}
                                                             for t in (block["text"][:5], block["text"][5:])]
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in ('{"command": ', '"ls"}')]
        events.append(("content_block_start", {"index": index, "content_block": opened}))
        events += [("content_block_delta", {"index": index, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"index": index}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events += [("message_delta", {"delta": stop, "usage": {"output_tokens": 9}}), ("message_stop", {})]
    return [(name, {"type": name, **data}) for name, data in events]


def _responses_events(response: dict) -> list[tuple[str, dict]]:
    opened = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [(name, {"response": opened}) for name in ("response.created", "response.in_progress")]
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events += [
                ("response.output_item.added", {"output_index": index, "item": {**item, "content": []}}),
                ("response.content_part.added", {**where, "content_index": 0, "part": {**TEXT_PART, "text": ""}}),
                ("response.output_text.delta", {**where, "content_index": 0, "delta": text, "logprobs": []}),
                ("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}),
                ("response.content_part.done", {**where, "content_index": 0, "part": item["content"][0]}),
            ]
        elif item["type"] == "function_call":
            events += [
                ("response.output_item.added", {"output_index": index, "item": {**item, "arguments": ""}}),
                ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}),
            ]
        else:
            events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": response}))
    return [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(events)]  # fmt: skip


@pytest.fixture
async def upstream():
    async with DialectUpstream() as upstream:
        yield upstream


def black_box_config(upstream_url: str, tmp_path) -> ServerConfig:
    return ServerConfig(
        **{**SERVER_DEFAULTS, "mode": "black_box", "record_path": tmp_path / "rollouts.jsonl",
           "upstream": UpstreamConfig(**{**UPSTREAM_DEFAULTS, "base_url": upstream_url, "api_key": SERVER_KEY,
                                         "model": UPSTREAM_MODEL})}  # fmt: skip
    )


@pytest.fixture
async def server(upstream, tmp_path):
    async with InterceptionServer(black_box_config(upstream.url, tmp_path)) as server:
        yield server


@pytest.fixture
async def clients():
    opened = []  # SDK clients, closed at the end of the test on its own event loop
    yield lambda client: opened.append(client) or client
    for client in opened:
        await client.close()


def anthropic_client(handle) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=handle.base_url.removesuffix("/v1"), api_key=handle.secret, max_retries=0)


def openai_client(handle) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=0)


def assert_relayed_with_server_credentials(upstream: DialectUpstream, handle, client) -> None:
    headers, body = upstream.requests[-1]
    assert body["model"] == UPSTREAM_MODEL
    assert handle.secret not in orjson.dumps(headers).decode()
    if isinstance(client, AsyncAnthropic):
        assert headers["x-api-key"] == SERVER_KEY and "authorization" not in headers
        assert headers["anthropic-version"] == client.default_headers["anthropic-version"]  # the SDK's, passed on
    else:
        assert headers["authorization"] == f"Bearer {SERVER_KEY}" and "x-api-key" not in headers


async def test_a_cookie_the_upstream_sets_for_one_rollout_never_goes_out_with_another(upstream, clients, tmp_path):
    # By host name: an HTTP client's cookie jar ignores cookies from a bare IP address, not from a named host.
    config = black_box_config(upstream.url.replace("127.0.0.1", "localhost"), tmp_path)
    request = {"model": "claude-agent", "max_tokens": 256, "messages": [USER]}
    upstream.cookie = "belongs-to-the-first-rollout"
    async with InterceptionServer(config) as server:
        first, second = server.open_rollout(), server.open_rollout()
        await clients(anthropic_client(first)).messages.create(**request)
        await clients(anthropic_client(second)).messages.create(**request)
        await clients(anthropic_client(first)).messages.create(**request)
    assert len(upstream.requests) == 3
    assert all("cookie" not in headers for headers, _ in upstream.requests)


# ------------------------------------------------------------------------------------------------ Messages


@pytest.mark.parametrize("then", ["text", "tool"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_messages_turn_is_relayed_as_it_came_and_traced(server, upstream, clients, then, stream):
    upstream.then = then
    handle = server.open_rollout()
    client = clients(anthropic_client(handle))
    request = {"model": "claude-agent", "max_tokens": 256, "system": "Be brief.", "messages": [USER], "tools": [BASH]}
    if stream:
        async with client.messages.with_streaming_response.create(**request, stream=True) as raw:
            received = b"".join([chunk async for chunk in raw.iter_bytes()])
        async with client.messages.stream(**request) as events:
            message = await events.get_final_message()
    else:
        raw = await client.messages.with_raw_response.create(**request)
        received = raw.http_response.content
        message = await client.messages.create(**request)
    assert received == upstream.sent[0]  # byte for byte, JSON or stream
    assert [b.model_dump(exclude_none=True) for b in message.content] == {"text": MESSAGES_TEXT,
                                                                          "tool": MESSAGES_TOOL}[then]
    assert_relayed_with_server_credentials(upstream, handle, client)
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "ok" and record.reward == 1.0
    [first, _] = record.trace
    assert first["new_messages"] == [{"role": "system", "content": "Be brief."}, USER]
    assert first["response"] == (TOOL_RECORDED if then == "tool" else TEXT_RECORDED)
    assert first["finish_reason"] == ("tool_calls" if then == "tool" else "stop")
    assert record.usage["prompt_tokens"] == 21 * 2 and record.usage["completion_tokens"] == 9 * 2


async def test_messages_options_the_gate_refuses_and_the_version_headers_reach_the_upstream(server, upstream, clients):
    handle = server.open_rollout()
    client = clients(anthropic_client(handle))
    web_search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    await client.messages.create(
        model="m", max_tokens=16, messages=[USER], stop_sequences=["\n\nHuman:"], tool_choice={"type": "any"},
        tools=[BASH, web_search], extra_body={"top_k": 5},
        extra_headers={"anthropic-version": "2023-01-01", "anthropic-beta": "tools-2024"},
    )  # fmt: skip
    headers, body = upstream.requests[0]
    assert body["stop_sequences"] == ["\n\nHuman:"] and body["tool_choice"] == {"type": "any"}
    assert body["tools"] == [BASH, web_search] and body["top_k"] == 5
    assert headers["anthropic-version"] == "2023-01-01" and headers["anthropic-beta"] == "tools-2024"
    async with aiohttp.ClientSession() as http:  # a client that names no version
        async with http.post(f"{handle.base_url}/messages", headers={"x-api-key": handle.secret},
                             json={"model": "m", "max_tokens": 16, "messages": [USER]}) as resp:  # fmt: skip
            assert resp.status == 200 and await resp.read() == upstream.sent[1]
    headers, _ = upstream.requests[1]
    assert headers["anthropic-version"] == "2023-06-01" and "anthropic-beta" not in headers


# ----------------------------------------------------------------------------------------------- Responses


@pytest.mark.parametrize("then", ["text", "tool"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_turn_is_relayed_as_it_came_and_traced(server, upstream, clients, then, stream):
    upstream.then = then
    handle = server.open_rollout()
    client = clients(openai_client(handle))
    request = {"model": "gpt-agent", "instructions": "Be brief.", "input": [USER], "tools": [FUNCTION]}
    if stream:
        async with client.responses.with_streaming_response.create(**request, stream=True) as raw:
            received = b"".join([chunk async for chunk in raw.iter_bytes()])
        async with client.responses.stream(**request) as events:
            response = await events.get_final_response()
    else:
        raw = await client.responses.with_raw_response.create(**request)
        received = raw.http_response.content
        response = await client.responses.create(**request)
    assert received == upstream.sent[0]
    output = RESPONSES_TOOL if then == "tool" else RESPONSES_TEXT
    assert [item.model_dump(exclude_none=True) for item in response.output] == output
    assert_relayed_with_server_credentials(upstream, handle, client)
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "ok" and record.reward == 1.0
    [first, _] = record.trace
    assert first["new_messages"] == [{"role": "system", "content": "Be brief."}, USER]
    expected = TEXT_RECORDED
    if then == "tool":  # the reasoning item, the message item, the call
        expected = {**TOOL_RECORDED, "content": TEXT_PART["text"], "tool_calls": [{**CALL_RECORDED, "id": "call_1"}]}
    assert first["response"] == expected
    assert first["finish_reason"] == ("tool_calls" if then == "tool" else "stop")
    assert record.usage["prompt_tokens"] == 21 * 2 and record.usage["completion_tokens"] == 9 * 2


async def test_a_follow_up_responses_turn_records_only_its_new_items(server, upstream, clients):
    handle = server.open_rollout()
    client = clients(openai_client(handle))
    upstream.then = "tool"
    first = await client.responses.create(model="m", input=[USER], tools=[FUNCTION])
    upstream.then = "text"
    result = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}
    echoed = [item.model_dump(exclude_none=True) for item in first.output]
    await client.responses.create(model="m", input=[USER, *echoed, result], tools=[FUNCTION])
    record = await server.finish_rollout(handle.id)
    assert record.trace[0]["response"]["tool_calls"][0]["id"] == "call_1"
    assert record.trace[1]["known_messages"] == 1  # the user's message; the reply is new to the requests
    assistant, tool = record.trace[1]["new_messages"]
    assert assistant["reasoning_content"] == "I should list them." and assistant["tool_calls"][0]["id"] == "call_1"
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}


async def test_responses_options_the_gate_refuses_reach_the_upstream(server, upstream, clients):
    handle = server.open_rollout()
    await clients(openai_client(handle)).responses.create(
        model="m", input="hi", tool_choice="required", tools=[FUNCTION, {"type": "web_search"}],
        previous_response_id="resp_earlier", text={"format": {"type": "json_object"}},
    )  # fmt: skip
    _, body = upstream.requests[0]
    assert body["tool_choice"] == "required" and body["previous_response_id"] == "resp_earlier"
    assert body["tools"][1] == {"type": "web_search"} and body["text"] == {"format": {"type": "json_object"}}


# -------------------------------------------------------------------------------------------------- faults


async def _messages_turn(clients, handle, stream: bool) -> None:
    client = clients(anthropic_client(handle))
    request = {"model": "m", "max_tokens": 16, "messages": [USER]}
    if stream:
        async with client.messages.stream(**request) as events:
            await events.get_final_message()
    else:
        await client.messages.create(**request)


@pytest.mark.parametrize("status", [529, 503, 500])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_messages_upstream_failure_is_an_anthropic_error(server, upstream, clients, status, stream):
    upstream.then = status
    handle = server.open_rollout()
    with pytest.raises(anthropic.APIStatusError) as caught:
        await _messages_turn(clients, handle, stream)
    assert caught.value.status_code == 529  # relayed as it came, or retried until the budget ran out
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "overloaded_error"
    assert len(upstream.requests) == (1 if status == 529 else UPSTREAM_DEFAULTS["attempts"])
    await _assert_not_rewarded(server, handle)


async def test_a_messages_stream_broken_off_ends_with_an_error_event_and_no_reward(server, upstream, clients):
    upstream.then = "break"
    handle = server.open_rollout()
    with pytest.raises(anthropic.APIStatusError) as caught:
        await _messages_turn(clients, handle, stream=True)
    assert caught.value.body["error"]["type"] == "overloaded_error" and "broke off" in str(caught.value.body)
    await _assert_not_rewarded(server, handle, stream_error=True)


@pytest.mark.parametrize("status", [529, 503, 500])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_upstream_failure_is_an_openai_error(server, upstream, clients, status, stream):
    upstream.then = status
    handle = server.open_rollout()
    with pytest.raises(openai.APIStatusError) as caught:
        await clients(openai_client(handle)).responses.create(model="m", input="hi", stream=stream)
    assert caught.value.status_code == (529 if status == 529 else 503)
    assert isinstance(caught.value.body, dict) and caught.value.body["message"]  # OpenAI's shape, `error` unwrapped
    await _assert_not_rewarded(server, handle)


async def test_a_responses_stream_broken_off_ends_with_response_failed_and_no_reward(server, upstream, clients):
    upstream.then = "break"
    handle = server.open_rollout()
    stream = await clients(openai_client(handle)).responses.create(model="m", input="hi", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.code == "upstream_unavailable" and "broke off" in failed.response.error.message
    assert failed.sequence_number == events[-2].sequence_number + 1
    await _assert_not_rewarded(server, handle, stream_error=True)


async def _assert_not_rewarded(server, handle, *, stream_error: bool = False) -> None:
    record = await server.finish_rollout(handle.id, reward=1.0)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "upstream"
    assert ("stream_error" in record.trace[-1]) == stream_error
