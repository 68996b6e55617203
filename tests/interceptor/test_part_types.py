"""A content part or block whose `type` is not a string (a list, an object) is a 400 in the dialect's own error
shape, in every dialect and wherever parts are read: a message's content, a tool result, Responses'
`function_call_output.output`. (The Responses dialect once looked such a type up in a set: a 500.)"""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}


def _bodies(kind: object) -> dict[str, tuple[str, dict]]:
    part = {"type": kind, "text": "x"}
    return {
        "responses.message": ("responses", {"model": "p", "input": [{"role": "user", "content": [part]}]}),
        "responses.function_call_output": ("responses", {"model": "p", "input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [part]}]}),
        "chat.message": ("chat/completions", {"model": "p", "messages": [{"role": "user", "content": [part]}]}),
        "chat.tool": ("chat/completions", {"model": "p", "messages": [
            {"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": [part]}]}),
        "messages.message": ("messages", {"model": "p", "max_tokens": 8,
                                          "messages": [{"role": "user", "content": [part]}]}),
        "messages.tool_result": ("messages", {"model": "p", "max_tokens": 8, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [part]}]}]}),
        "messages.system": ("messages", {"model": "p", "max_tokens": 8, "system": [part],
                                         "messages": [{"role": "user", "content": "hi"}]}),
    }


@pytest.fixture
async def server(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server:
        yield server


@pytest.mark.parametrize("kind", [[], {}, ["text"], {"type": "text"}], ids=["list", "object", "list_of_a_name",
                                                                             "object_with_a_type"])
@pytest.mark.parametrize("place", list(_bodies(None)))
async def test_a_part_type_that_is_not_a_string_is_a_400_in_the_dialects_shape(server, scripted, place, kind):
    route, body = _bodies(kind)[place]
    handle = server.open_rollout()
    async with aiohttp.ClientSession() as http, http.post(
            f"{handle.base_url}/{route}", data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {handle.secret}", "Content-Type": "application/json"}) as resp:
        status, answer = resp.status, orjson.loads(await resp.read())
    assert status == 400, answer
    if route == "messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
    else:
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"], answer
    assert not scripted.calls  # nothing reached the upstream
