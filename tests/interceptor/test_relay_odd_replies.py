"""black_box relays of answers whose fields the trace reads have odd types (a list as a tool call's or a block's
index, an object as a stop reason, a string as a token count): the agent gets the upstream's bytes as they came,
the trace keeps what it can read, and nothing fails. (The collectors once used such an index as a dict key: an
error after the stream's headers, the agent's stream cut off.)"""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest
from aiohttp import web

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig


def _sse(*events: dict, named: bool = False) -> bytes:
    out = b""
    for event in events:
        head = b"event: " + event["type"].encode() + b"\n" if named else b""
        out += head + b"data: " + orjson.dumps(event) + b"\n\n"
    return out


CHAT_STREAM = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": [], "id": "c1", "function": {"name": "ls"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "1", "function": {"arguments": {"a": 1}}}]}}]},
    {"choices": "not a list"},
    {"choices": [{"delta": ["not", "a", "delta"], "finish_reason": "stop"}], "usage": {"prompt_tokens": "12"}},
) + b"data: [DONE]\n\n"
MESSAGES_STREAM = _sse(
    {"type": "message_start", "message": {"usage": {"input_tokens": [3]}}},
    {"type": "content_block_start", "index": [0], "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": {"i": 0}, "delta": {"type": "text_delta", "text": "lost"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "message_delta", "delta": {"stop_reason": {"why": "done"}}, "usage": {"output_tokens": "2"}},
    {"type": "error", "error": ["not", "an", "object"]},
    {"type": "message_stop"},
    named=True,
)
RESPONSES_STREAM = _sse(
    {"type": "response.output_item.done", "output_index": [1], "item": {"type": "message", "content": [
        {"type": "output_text", "text": "hi"}]}},
    {"type": "response.output_item.done", "output_index": "0", "item": {"type": "function_call", "call_id": "c1",
                                                                        "name": "ls", "arguments": "{}"}},
    {"type": "response.failed", "response": {"output": [], "error": "not an object",
                                             "incomplete_details": ["x"], "usage": {"input_tokens": {}}}},
    named=True,
)
MESSAGES_JSON = {"type": "message", "content": [{"type": "text", "text": "hi"}], "stop_reason": ["end_turn"],
                 "usage": {"input_tokens": "3", "output_tokens": None}}
RESPONSES_JSON = {"object": "response", "status": "incomplete", "incomplete_details": "max_output_tokens",
                  "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
                  "usage": {"input_tokens": 3.5, "output_tokens": [1]}}

# dialect -> (route, body the agent sends, what the upstream answers a stream, and a JSON request)
CASES = {
    "chat": ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, CHAT_STREAM,
             {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": ["stop"]}],
              "usage": {"prompt_tokens": [1], "completion_tokens": "x"}}),
    "messages": ("messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                 MESSAGES_STREAM, MESSAGES_JSON),
    "responses": ("responses", {"model": "m", "input": "hi"}, RESPONSES_STREAM, RESPONSES_JSON),
}


@pytest.fixture
async def upstream():
    """Answers each dialect's route with that case's stream, or its JSON when the request does not stream."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        _, _, stream, reply = next(c for c in CASES.values() if request.path.endswith("/" + c[0]))
        if not body.get("stream"):
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream)
        await response.write_eof()
        return response

    app = web.Application()
    for route, *_ in CASES.values():
        app.router.add_post(f"/v1/{route}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", CASES)
async def test_odd_field_types_in_a_relayed_answer_reach_the_agent_unchanged_and_fail_nothing(
        upstream, dialect, stream, caplog):
    route, body, expected_stream, expected_json = CASES[dialect]
    config = ServerConfig(mode="black_box", upstream=UpstreamConfig(base_url=upstream, attempts=1))
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        handle = server.open_rollout()
        async with http.post(f"{handle.base_url}/{route}", data=orjson.dumps({**body, "stream": stream}),
                             headers={"Authorization": f"Bearer {handle.secret}"}) as resp:
            status, raw = resp.status, await resp.read()
        record = await server.finish_rollout(handle.id, reward=1.0)
    assert status == 200, raw
    assert raw == expected_stream if stream else orjson.loads(raw) == expected_json
    [entry] = record.trace
    assert entry["status"] == 200 and "response" in entry, entry
    # the Messages and Responses streams end in their own error event: the upstream's failure, as always
    assert record.status == ("failed" if stream and dialect != "chat" else "ok"), record.failure
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
