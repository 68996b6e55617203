"""The fast lane (`interceptor/transport/lane.py`): the gate's turns (streamed or not) and the JSON routes are answered off
the socket, every other request by aiohttp as before, and a client cannot tell the two apart.

Each test runs real servers on loopback over the scripted upstream: one with the lane and, where the two are
compared, one without (`fast_lane=False`), and talks to them with aiohttp's client or raw HTTP/1.1 bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import socket
from contextlib import AsyncExitStack

import aiohttp
import orjson
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.cli import _build_parser
from interceptor.serve_main import config_from_args
from interceptor.store.records import RolloutRecord
from interceptor.transport.lane import Lane, LaneReply
from interceptor.transport.lane_routes import LaneRoutes
from tests.fakes import Fault, Slow

ADMIN = "admin-token-for-lane-tests"


def _config(scripted, model_dir, tmp_path, *, fast_lane: bool, **options) -> ServerConfig:
    return ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url, attempts=1, request_timeout_s=5.0),
        model_dir=model_dir,
        admin_token=ADMIN,
        record_path=tmp_path / f"rollouts-{'lane' if fast_lane else 'aiohttp'}.jsonl",
        max_body_bytes=64 * 1024,
        fast_lane=fast_lane,
        **options,
    )


@pytest.fixture
async def servers(scripted, tiny_model_dir, tmp_path):
    """(with the lane, without it), over the same scripted upstream."""
    async with AsyncExitStack() as stack:
        lane = await stack.enter_async_context(InterceptionServer(_config(scripted, tiny_model_dir, tmp_path, fast_lane=True)))
        plain = await stack.enter_async_context(InterceptionServer(_config(scripted, tiny_model_dir, tmp_path, fast_lane=False)))
        yield lane, plain


@pytest.fixture
async def server(servers):
    return servers[0]


# ---------------------------------------------------------------------------------------------- raw HTTP


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue): the real one follows
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.read()
    return status, headers, body


async def _exchange(port: int, data: bytes, answers: int = 1, *, half_close: bool = False):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        return [await _read_response(reader) for _ in range(answers)], reader
    finally:
        writer.close()


def _request(path: str, body: bytes, headers: dict[str, str] | None = None, *, version: str = "HTTP/1.1",
             method: str = "POST") -> bytes:
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if "Transfer-Encoding" not in (headers or {}) and "Content-Length" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _chat(content: str = "hi", **extra) -> bytes:
    return orjson.dumps({"model": "policy", "messages": [{"role": "user", "content": content}], **extra})


def _turn_path(handle) -> str:
    return f"/rollout/{handle.id}/v1/chat/completions"


# ------------------------------------------------------------------------------------------------- tests


async def test_non_streamed_turns_go_through_the_lane_and_the_upstream_sees_the_same_prompts(servers, scripted):
    answers, prompts = {}, {}
    for server in servers:
        handle = server.open_rollout()
        messages = [{"role": "user", "content": "list the files"}]
        got = []
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {handle.secret}"}) as http:
            for turn in range(3):
                before = len(scripted.calls)
                async with http.post(handle.base_url + "/chat/completions",
                                     json={"model": "policy", "messages": messages}) as resp:
                    assert resp.status == 200
                    body = await resp.json()
                reply = body["choices"][0]["message"]
                got.append((reply["role"], reply["content"], body["usage"]))
                messages += [{"role": "assistant", "content": reply["content"]},
                             {"role": "user", "content": f"and turn {turn}"}]
                prompts.setdefault(server.config.fast_lane, []).append(scripted.calls[before].prompt_ids)
        answers[server.config.fast_lane] = got
        record = await server.finish_rollout(handle.id)
        assert record.status == "ok"
    assert answers[True] == answers[False]
    assert prompts[True] == prompts[False]
    lane, plain = servers
    assert lane.lane.served >= 3 and lane.lane.handed_over == 0
    assert plain.lane is None


async def _sse_turns(server, connection_limit: int = 1, **config) -> list[tuple[int, bytes]]:
    handle = server.open_rollout()
    connector = aiohttp.TCPConnector(limit=connection_limit)  # one connection for every call
    answers = []
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {handle.secret}"}) as http:
        for extra in ({}, {"stream": True}, {}):
            async with http.post(handle.base_url + "/chat/completions",
                                 json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], **extra}) as resp:
                answers.append((resp.status, await resp.read()))
    assert len(server.registry.get(handle.id).trace) == 3
    return answers


def _events(body: bytes) -> list[object]:
    """The stream's data events without their ids and times, and its comment lines (keepalives) as '#'."""
    events = []
    for line in body.decode().split("\n"):
        if line.startswith(":"):
            events.append("#")
        elif line.startswith("data: "):
            data = line[6:]
            if data == "[DONE]":
                events.append(data)
            else:
                event = orjson.loads(data)
                events.append({k: v for k, v in event.items() if k not in ("id", "created")})
    return events


async def test_a_streamed_turn_is_answered_by_the_lane_as_aiohttp_answers_it(servers):
    lane, plain = servers
    with_lane, without = await _sse_turns(lane), await _sse_turns(plain)
    assert [status for status, _ in with_lane] == [200, 200, 200]
    assert _events(with_lane[1][1]) == _events(without[1][1])
    assert _events(with_lane[1][1])[-1] == "[DONE]"
    assert lane.lane.served == 3 and lane.lane.handed_over == 0


async def test_a_stream_that_outlasts_its_hold_sends_keepalives_then_the_answer(scripted, tiny_model_dir, tmp_path):
    events = {}
    for fast_lane in (True, False):
        async with InterceptionServer(_config(scripted, tiny_model_dir, tmp_path, fast_lane=fast_lane,
                                              stream_hold_s=0.05, keepalive_s=0.05)) as server:
            scripted.script(Slow("a slow answer", delay_s=0.5))
            handle = server.open_rollout()
            [(status, headers, body)], _ = await _exchange(server._port, _request(
                _turn_path(handle), _chat(stream=True), {"Authorization": f"Bearer {handle.secret}"}))
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            events[fast_lane] = _events(body)
    for got in events.values():
        assert "#" in got and got[-1] == "[DONE]"
        assert b"a slow answer" in orjson.dumps(got)
    assert [e for e in events[True] if e != "#"] == [e for e in events[False] if e != "#"]


async def test_a_client_that_hangs_up_mid_stream_leaves_its_turn_recorded_and_the_lane_serving(
        scripted, tiny_model_dir, tmp_path, caplog):
    config = _config(scripted, tiny_model_dir, tmp_path, fast_lane=True, stream_hold_s=0.05, keepalive_s=0.05)
    async with InterceptionServer(config) as server:
        scripted.script(Slow("never read", delay_s=0.4))
        handle = server.open_rollout()
        reader, writer = await asyncio.open_connection("127.0.0.1", server._port)
        writer.write(_request(_turn_path(handle), _chat(stream=True), {"Authorization": f"Bearer {handle.secret}"}))
        await reader.readuntil(b"\r\n\r\n")  # the head: the hold is over, keepalives are coming
        writer.transport.abort()
        rollout = server.registry.get(handle.id)
        async with asyncio.timeout(30):
            while not rollout.trace:
                await asyncio.sleep(0.02)
        [(status, _, _)], _ = await _exchange(server._port, _request(
            _turn_path(handle), _chat("again"), {"Authorization": f"Bearer {handle.secret}"}))
    assert status == 200
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def _unread_by_lane(secret: str, path: str) -> dict[str, bytes]:
    """Requests the lane hands to aiohttp, each with what aiohttp answers it."""
    auth = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    body = _chat()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return {
        "chunked body": _request(path, chunked, {**auth, "Transfer-Encoding": "chunked"}),
        "gzip body": _request(path, gzip.compress(body), {**auth, "Content-Encoding": "gzip"}),
        "HTTP/1.0": _request(path, body, auth, version="HTTP/1.0"),
        "query string": _request(path + "?x=1", body, auth),
        "body over the limit": _request(path, _chat("x" * 70_000), auth),
        "two lengths": _request(path, body, {**auth, "Content-Length": f"{len(body)}\r\nContent-Length: 3"}),
        "space before a colon": _request(path, body, {**auth, "X-Odd ": "1"}),
        "bad length": _request(path, body, {**auth, "Content-Length": "+12"}),
        "expect 100-continue": _request(path, body, {**auth, "Expect": "100-continue"}),
        "an escape in the path": _request(path.replace("/v1/", "/%761/"), body, auth),
        "a control byte in a header": _request(path, body, {**auth, "X-Odd": "a\x01b"}),
        "not a route of the lane": _request(path.replace("/chat/completions", "/embeddings"), body, auth),
    }


async def test_requests_the_lane_does_not_read_get_the_answer_aiohttp_gives_without_the_lane(servers):
    lane, plain = servers
    results = {}
    for server in servers:
        handle = server.open_rollout()
        for name, data in _unread_by_lane(handle.secret, _turn_path(handle)).items():
            try:
                [(status, _, body)], _ = await asyncio.wait_for(_exchange(server._port, data), 30)
            except (asyncio.IncompleteReadError, ConnectionError):
                status, body = "closed", b""
            results.setdefault(name, []).append((status, sorted(orjson.loads(body)) if body[:1] == b"{" else body[:0]))
    for name, (with_lane, without) in results.items():
        assert with_lane == without, name
    assert results["gzip body"][0][0] == results["chunked body"][0][0] == results["an escape in the path"][0][0] == 200
    assert results["body over the limit"][0][0] == 413
    assert lane.lane.served == 0 and lane.lane.handed_over == len(results)


async def test_pipelined_requests_are_answered_in_order(server, scripted):
    handle = server.open_rollout()
    scripted.script("first answer", "second answer")
    auth = {"Authorization": f"Bearer {handle.secret}"}
    first = _chat("one")
    second = orjson.dumps({"model": "policy", "messages": [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "two"}]})
    answers, _ = await _exchange(server._port, _request(_turn_path(handle), first, auth)
                                 + _request(_turn_path(handle), second, auth), answers=2)
    contents = [orjson.loads(body)["choices"][0]["message"]["content"] for _, _, body in answers]
    assert [status for status, _, _ in answers] == [200, 200]
    assert contents == ["first answer", "second answer"]
    assert server.lane.served == 2


async def test_errors_answered_by_the_lane_are_those_of_aiohttps_path(servers, scripted):
    seen = {}
    for server in servers:
        handle = server.open_rollout()
        anthropic = f"/rollout/{handle.id}/v1/messages"
        cases = {
            "wrong secret": _request(_turn_path(handle), _chat(), {"Authorization": "Bearer nope"}),
            "a secret that is not UTF-8": _request(_turn_path(handle), _chat(), {"Authorization": "Bearer \xe9t\xe9"}),
            "no secret, messages": _request(anthropic, b"{}", {}),
            "not JSON": _request(_turn_path(handle), b"{not json", {"Authorization": f"Bearer {handle.secret}"}),
            "unknown rollout": _request("/rollout/nosuchrollout/v1/chat/completions", _chat(), {}),
            "upstream down": _request(_turn_path(handle), _chat(), {"Authorization": f"Bearer {handle.secret}"}),
        }
        for name, data in cases.items():
            if name == "upstream down":
                scripted.script(Fault(status=503, message="overloaded"))
            [(status, headers, body)], _ = await _exchange(server._port, data)
            seen.setdefault(name, []).append((status, headers.get("retry-after"), orjson.loads(body)))
    for name, (with_lane, without) in seen.items():
        assert with_lane == without, name
    assert seen["wrong secret"][0][0] == 401 and "error" in seen["wrong secret"][0][2]
    assert seen["no secret, messages"][0][2]["type"] == "error"  # Anthropic's shape on its path
    assert seen["not JSON"][0][0] == 400
    assert seen["upstream down"][0][:2] == (503, "1")
    assert servers[0].lane.handed_over == 0  # every error was the lane's own answer


async def test_connection_close_and_a_half_closed_request_are_answered_then_closed(server):
    handle = server.open_rollout()
    auth = {"Authorization": f"Bearer {handle.secret}"}
    [(status, headers, _)], reader = await _exchange(
        server._port, _request(_turn_path(handle), _chat(), {**auth, "Connection": "close"}))
    assert status == 200 and headers.get("connection") == "close"
    assert await reader.read() == b""  # and the server closed it
    [(status, _, _)], reader = await _exchange(server._port, _request(_turn_path(handle), _chat(), auth), half_close=True)
    assert status == 200
    assert await reader.read() == b""


async def test_a_turn_whose_client_hung_up_is_still_recorded(server, scripted):
    handle = server.open_rollout()
    scripted.script(Slow("a slow answer", delay_s=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", server._port)
    writer.write(_request(_turn_path(handle), _chat(), {"Authorization": f"Bearer {handle.secret}"}))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.transport.abort()  # gone before the answer
    rollout = server.registry.get(handle.id)
    async with asyncio.timeout(30):
        while not rollout.trace:
            await asyncio.sleep(0.02)
    record = await server.finish_rollout(handle.id)
    assert record.status == "ok"
    assert len(record.trace) == 1 and b"a slow answer" in orjson.dumps(record.trace)


async def test_shutdown_lets_a_turn_in_progress_finish(scripted, tiny_model_dir, tmp_path):
    scripted.script(Slow("answered during shutdown", delay_s=0.3))
    async with InterceptionServer(_config(scripted, tiny_model_dir, tmp_path, fast_lane=True)) as server:
        handle = server.open_rollout()
        pending = asyncio.ensure_future(_exchange(
            server._port, _request(_turn_path(handle), _chat(), {"Authorization": f"Bearer {handle.secret}"})))
        rollout = server.registry.get(handle.id)
        async with asyncio.timeout(30):
            while not rollout.in_flight:  # the turn is waiting on the slow upstream
                await asyncio.sleep(0.01)
        assert not pending.done()
    [(status, _, body)], _ = await pending
    assert status == 200
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "answered during shutdown"


async def test_the_admin_api_and_a_rollouts_json_routes_are_answered_by_the_lane(server):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        async with http.post(server.url + "/rollouts", json={"metadata": {"task": "t1"}}, headers=admin) as resp:
            assert resp.status == 201
            opened = await resp.json()
        chat = {"Authorization": f"Bearer {opened['secret']}"}
        async with http.get(opened["base_url"] + "/models", headers=chat) as resp:
            assert (await resp.json())["data"][0]["id"] == "policy"
        async with http.post(opened["base_url"] + "/tools/answer", json={"answer": "42"}, headers=chat) as resp:
            assert resp.status == 200
        async with http.get(server.url + f"/rollouts/{opened['id']}", headers=admin) as resp:
            assert (await resp.json())["answered"] is True
        async with http.get(server.url + f"/rollouts/{opened['id']}", headers={"Authorization": "Bearer no"}) as resp:
            assert resp.status == 401 and "error" in await resp.json()
        async with http.post(server.url + f"/rollouts/{opened['id']}/finish", json={"reward": 1.0}, headers=admin) as resp:
            assert resp.status == 200
            record = await resp.json()
        async with http.get(server.url + "/health") as resp:
            assert (await resp.json())["status"] == "ok"
    assert record["answer"] == "42" and record["metadata"] == {"task": "t1"}
    assert server.lane.served == 7 and server.lane.handed_over == 0


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "aiohttp"])
async def test_the_finish_answer_is_the_record_files_line_serialised_once(servers, lane, monkeypatch):
    server = servers[0 if lane else 1]
    serialised = []
    to_json = RolloutRecord.to_json
    monkeypatch.setattr(RolloutRecord, "to_json",
                        lambda record: serialised.append(record.rollout_id) or to_json(record))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(server.url + "/rollouts", json={"metadata": {"task": "t2"}}, headers=admin) as resp:
            opened = await resp.json()
        finish = server.url + f"/rollouts/{opened['id']}/finish"
        async with http.post(finish, json={"reward": 0.5}, headers=admin) as resp:
            assert resp.status == 200
            answered = await resp.read()
    line = server.config.record_path.read_bytes().splitlines()[-1]
    assert answered == line and orjson.loads(line)["reward"] == 0.5
    assert serialised == [opened["id"]]


async def test_a_server_without_a_record_file_answers_the_finish_with_the_record(scripted, tiny_model_dir,
                                                                                   tmp_path):
    config = dataclasses.replace(_config(scripted, tiny_model_dir, tmp_path, fast_lane=True), record_path=None)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
        async with http.post(server.url + "/rollouts", json={}, headers=admin) as resp:
            opened = await resp.json()
        finish = server.url + f"/rollouts/{opened['id']}/finish"
        async with http.post(finish, json={"reward": 1}, headers=admin) as resp:
            assert resp.status == 200
            record = await resp.json()
    assert record["rollout_id"] == opened["id"] and record["reward"] == 1.0 and record["status"] == "ok"
    assert not list(tmp_path.glob("*.jsonl"))


async def test_an_idle_connection_is_closed_after_the_keepalive():
    routes = LaneRoutes()

    async def hello(request):
        return LaneReply(200, b'{"hello": true}')

    routes.add("GET", "/hello", hello)
    lane = await Lane.start(lambda: asyncio.Protocol(), host="127.0.0.1", port=0, take=routes.take,
                            on_error=lambda request, exc: LaneReply(500, b"{}"), max_body_bytes=1024, keepalive_s=0.1)
    try:
        [(status, _, body)], reader = await _exchange(lane.port, _request("/hello", b"", method="GET"))
        assert (status, body) == (200, b'{"hello": true}')
        async with asyncio.timeout(30):
            assert await reader.read() == b""  # closed by the server once idle
    finally:
        await lane.aclose()


def test_serve_takes_no_fast_lane(tmp_path):
    parser, _, _ = _build_parser(())
    base = ["serve", "--upstream", "http://127.0.0.1:9", "--model", str(tmp_path)]
    assert config_from_args(parser.parse_args(base)).fast_lane is True
    assert config_from_args(parser.parse_args([*base, "--no-fast-lane"])).fast_lane is False


async def test_a_tcp_client_gets_no_delay_on_the_lane(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server._port)
    try:
        await asyncio.sleep(0.05)
        [connection] = list(server.lane._connections)
        sock = connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        writer.close()
