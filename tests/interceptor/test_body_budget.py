"""Request bodies still arriving hold at most `max_pending_body_bytes` of the server, all connections together
(`interceptor/wire/body_budget.py`): a request whose declared body would pass it gets a 503 in its client's error shape
and its connection closed; a body that arrives, or a connection that goes, gives its share back; a body aiohttp
reads must arrive within `body_timeout_s` (408). With the fast lane (which reads the gate's turns) and without it.

Every request is raw HTTP/1.1 on loopback to a real server over the scripted upstream: a head, then part of a body.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

MAX_BODY = 256 * 1024
BUDGET = 512 * 1024  # two bodies of MAX_BODY in flight, not three
BOUND_S = 30.0


def _config(scripted, tiny_model_dir, fast_lane: bool, body_timeout_s: float = 60.0) -> ServerConfig:
    return ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1), model_dir=tiny_model_dir,
                        max_body_bytes=MAX_BODY, max_pending_body_bytes=BUDGET, body_timeout_s=body_timeout_s,
                        fast_lane=fast_lane)


@pytest.fixture(params=[True, False], ids=["fast_lane", "aiohttp_only"])
async def server(request, scripted, tiny_model_dir):
    async with InterceptionServer(_config(scripted, tiny_model_dir, request.param)) as server:
        yield server


def _body(size: int) -> bytes:
    """A chat request of exactly `size` bytes: a short one, then JSON whitespace (no tokens)."""
    body = orjson.dumps({"model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    return body + b" " * (size - len(body))


async def _start(server, handle, body: bytes, sent: int, **headers: str):
    """A connection that has sent the head and the first `sent` bytes of `body`."""
    port = int(server.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    fields = {"Host": "x", "Authorization": f"Bearer {handle.secret}", "Content-Type": "application/json",
              "Content-Length": str(len(body)), **headers}
    head = f"POST /rollout/{handle.id}/v1/chat/completions HTTP/1.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields.items()) + "\r\n"
    writer.write(head.encode() + body[:sent])
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    status_line = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), orjson.loads(body)


async def _held(server, count: int) -> None:
    """Until the budget holds `count` bytes (the server reads a head in its own time)."""
    while server.body_limits.budget.held != count:
        await asyncio.sleep(0.01)


async def test_a_body_past_the_budget_is_refused_and_each_one_that_arrives_or_goes_gives_its_share_back(server):
    handle = server.open_rollout()
    body = _body(MAX_BODY)
    budget = server.body_limits.budget
    async with asyncio.timeout(BOUND_S):
        first = await _start(server, handle, body, 100)
        second = await _start(server, handle, body, 100)
        await _held(server, 2 * MAX_BODY)
        third = await _start(server, handle, body, 100)
        status, error = await _answer(third[0])
        assert status == 503 and error["error"]["code"] == "overloaded", error
        assert "retry" in error["error"]["message"]
        assert await third[0].read() == b""  # and closed
        assert (budget.held, budget.refused) == (2 * MAX_BODY, 1)

        first[1].write(body[100:])  # the first body arrives: its turn is answered, its share given back
        await first[1].drain()
        status, reply = await _answer(first[0])
        assert status == 200, reply
        await _held(server, MAX_BODY)
        second[1].close()  # the second client goes: its share comes back too
        await _held(server, 0)

        fourth = await _start(server, handle, body, 100)  # room again
        await _held(server, MAX_BODY)
        fourth[1].write(body[100:])
        await fourth[1].drain()
        assert (await _answer(fourth[0]))[0] == 200
        await _held(server, 0)
        for _, writer in (first, fourth):
            writer.close()
    assert budget.refused == 1


async def test_a_body_that_arrives_in_one_piece_takes_nothing_from_the_budget(server):
    handle = server.open_rollout()
    body = _body(MAX_BODY)
    async with asyncio.timeout(BOUND_S):
        held = [await _start(server, handle, body, 100) for _ in range(2)]  # the budget is full ...
        await _held(server, 2 * MAX_BODY)
        whole = await _start(server, handle, _body(1000), 1000)  # ... and a whole small body still goes through
        assert (await _answer(whole[0]))[0] == 200
        for _, writer in (*held, whole):
            writer.close()


@pytest.mark.parametrize("fast_lane", [True, False], ids=["fast_lane", "aiohttp_only"])
async def test_a_body_aiohttp_reads_must_arrive_in_time_and_a_chunked_one_holds_the_body_limit(
    fast_lane, scripted, tiny_model_dir
):
    async with InterceptionServer(_config(scripted, tiny_model_dir, fast_lane, body_timeout_s=0.5)) as server:
        await _stall_a_chunked_body(server)


async def _stall_a_chunked_body(server) -> None:
    handle = server.open_rollout()
    async with asyncio.timeout(BOUND_S):
        port = int(server.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (f"POST /rollout/{handle.id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {handle.secret}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n")  # chunked: aiohttp's to read, and then it stalls
        writer.write(head.encode())
        await writer.drain()
        await _held(server, MAX_BODY)
        status, error = await _answer(reader)
        assert status == 408 and error["error"]["code"] == "request_timeout", error
        await _held(server, 0)
        writer.close()
