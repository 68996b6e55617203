"""The lean HTTP/1.1 pool the gate calls its policy server through (`interceptor/transport/http1.py`), against real servers on
loopback: an aiohttp app for what well-behaved servers send (keep-alive, chunks, gzip, closes), and raw asyncio
servers for answers no framework would write (a broken status line, a body cut short, silence)."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from aiohttp import web

from interceptor.transport.http1 import Http1Pool, HttpError, lean_client_serves

JSON = {"Content-Type": "application/json"}


class App:
    """An aiohttp server on port 0 that counts the connections it was asked on."""

    def __init__(self, handler, *, keepalive_timeout: float = 75.0) -> None:
        self.handler = handler
        self.peers: list[tuple] = []
        self.keepalive_timeout = keepalive_timeout
        self.in_flight = 0
        self.most_in_flight = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.peers.append(request.transport.get_extra_info("peername"))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self.handler(request)
        finally:
            self.in_flight -= 1

    async def __aenter__(self) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=self.keepalive_timeout)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"path": request.path, "method": request.method, "got": body.decode(),
                              "type": request.headers.get("Content-Type")})


async def raw_server(answer, connections: list | None = None) -> tuple[asyncio.Server, str]:
    """A TCP server that reads one request head and then runs `answer(reader, writer)`; it notes each connection
    in `connections`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            connections.append(writer.get_extra_info("peername"))
        try:
            await reader.readuntil(b"\r\n\r\n")
            await answer(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_json_call_gets_the_status_and_whole_body_and_the_connection_is_kept_for_the_next():
    app = App(echo)
    async with app as url, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        answers = [await pool.request(b"POST", "/v1/completions", b'{"n":%d}' % i, JSON, timeout_s=10)
                   for i in range(5)]
    assert [status for status, _ in answers] == [200] * 5
    assert [json.loads(body)["got"] for _, body in answers] == [f'{{"n":{i}}}' for i in range(5)]
    assert len(set(app.peers)) == 1  # five requests, one connection


async def test_a_path_prefix_in_the_url_goes_before_every_path_and_a_large_body_arrives_whole():
    app = App(echo)
    big = b"x" * 3_000_000
    async with app as url, Http1Pool(url + "/prefix/", limit=4, connect_timeout_s=5) as pool:
        status, body = await pool.request(b"POST", "/v1/completions", big, JSON, timeout_s=30)
    got = json.loads(body)
    assert status == 200 and got["path"] == "/prefix/v1/completions" and len(got["got"]) == len(big)


async def test_chunked_and_gzip_answers_are_read_whole_and_decoded():
    text = b'{"text": "' + b"token " * 20000 + b'"}'

    async def chunked_gzip(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        packed = gzip.compress(text)
        for start in range(0, len(packed), 1000):
            await response.write(packed[start:start + 1000])
        await response.write_eof()
        return response

    app = App(chunked_gzip)
    async with app as url, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        first = await pool.request(b"GET", "/", None, {}, timeout_s=10)
        second = await pool.request(b"GET", "/", None, {}, timeout_s=10)
    assert first == second == (200, text)
    assert len(set(app.peers)) == 1  # the connection survives a chunked answer


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error():
    app = App(echo, keepalive_timeout=0.05)
    async with app as url, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        assert (await pool.request(b"GET", "/a", None, {}, timeout_s=10))[0] == 200
        await asyncio.sleep(0.5)  # the server closes the idle connection meanwhile
        assert (await pool.request(b"GET", "/b", None, {}, timeout_s=10))[0] == 200
    assert len(set(app.peers)) == 2


async def test_an_answer_that_asks_to_close_is_not_pooled_and_error_statuses_come_back_as_they_are():
    async def closing(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy"}}, status=503, headers={"Connection": "close"})

    app = App(closing)
    async with app as url, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        answers = [await pool.request(b"GET", "/", None, {}, timeout_s=10) for _ in range(3)]
    assert all(status == 503 and b"busy" in body for status, body in answers)
    assert len(set(app.peers)) == 3


async def test_no_more_connections_than_the_limit_are_open_at_once():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.Response(text="ok")

    app = App(slow)
    async with app as url, Http1Pool(url, limit=2, connect_timeout_s=5) as pool:
        answers = await asyncio.gather(*(pool.request(b"GET", "/", None, {}, timeout_s=30) for _ in range(8)))
    assert answers == [(200, b"ok")] * 8
    assert app.most_in_flight == 2 and len(set(app.peers)) == 2


@pytest.mark.parametrize("answer, says", [
    (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", "closed after 9 of the answer's bytes"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "malformed content-length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "ValueError"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nab", "unsupported content-encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nab", "does not inflate"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n", "is over 65536 bytes"),
])
async def test_an_answer_that_is_not_readable_http_is_an_http_error_that_says_why(answer, says):
    async def send(reader, writer):
        writer.write(answer)
        await writer.drain()

    server, url = await raw_server(send)
    async with server, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        with pytest.raises(HttpError, match=says):
            await pool.request(b"GET", "/", None, {}, timeout_s=10)


async def test_an_interim_1xx_answer_is_skipped_for_the_final_one():
    async def send(reader, writer):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
        await writer.drain()

    server, url = await raw_server(send)
    async with server, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        assert await pool.request(b"POST", "/", b"{}", JSON, timeout_s=10) == (201, b"done")


async def test_a_body_that_runs_to_the_close_is_read_whole_and_the_connection_is_not_reused():
    async def send(reader, writer):
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nto the end")
        await writer.drain()

    connections = []
    server, url = await raw_server(send, connections)
    async with server, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        assert await pool.request(b"GET", "/", None, {}, timeout_s=10) == (200, b"to the end")
        assert await pool.request(b"GET", "/", None, {}, timeout_s=10) == (200, b"to the end")
    assert len(connections) == 2


async def test_a_silent_server_is_a_timeout_and_a_closed_port_an_http_error():
    async def silent(reader, writer):
        await asyncio.sleep(30)

    server, url = await raw_server(silent)
    async with server, Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        with pytest.raises(TimeoutError):
            await pool.request(b"GET", "/", None, {}, timeout_s=0.2)
    server.close()
    await server.wait_closed()
    async with Http1Pool(url, limit=4, connect_timeout_s=5) as pool:
        with pytest.raises(HttpError, match="cannot connect"):
            await pool.request(b"GET", "/", None, {}, timeout_s=10)


def test_only_plain_http_without_credentials_takes_the_lean_path():
    assert lean_client_serves("http://127.0.0.1:8000") and lean_client_serves("http://vllm.internal/prefix")
    assert not lean_client_serves("https://api.example.com")
    assert not lean_client_serves("http://user:secret@127.0.0.1:8000")
    with pytest.raises(ValueError, match="plain http"):
        Http1Pool("https://api.example.com", limit=1, connect_timeout_s=1)


async def test_the_upstream_client_takes_the_lean_path_for_plain_http_and_aiohttp_for_credentials_in_the_url():
    from interceptor import UpstreamConfig
    from interceptor.transport.upstream import UpstreamClient

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "policy", "agent": request.headers.get("User-Agent", ""),
                                            "auth": request.headers.get("Authorization", "")}]})

    async with App(models) as url:
        async with UpstreamClient(UpstreamConfig(base_url=url + "/v1")) as plain:
            [lean] = await plain.models()
        with_credentials = url.replace("http://", "http://user:secret@")
        async with UpstreamClient(UpstreamConfig(base_url=with_credentials)) as client:
            [relayed] = await client.models()
    assert lean["agent"] == "" and lean["auth"] == ""  # no aiohttp User-Agent: the pool made the call
    assert "aiohttp" in relayed["agent"] and relayed["auth"].startswith("Basic ")


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "aiohttp"])
async def test_the_upstream_client_takes_the_pool_unless_it_is_turned_off(lean):
    # `UpstreamConfig.lean_client` (`interceptor serve --no-lean-client`): the switch the replay bench measures the
    # pool by. aiohttp's client names itself in User-Agent; the pool sends no such header.
    from interceptor import UpstreamConfig
    from interceptor.transport.upstream import UpstreamClient

    agents = []

    async def models(request: web.Request) -> web.Response:
        agents.append(request.headers.get("User-Agent"))
        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model"}]})

    async with App(models) as url, UpstreamClient(UpstreamConfig(base_url=url, lean_client=lean)) as client:
        assert [m["id"] for m in await client.models()] == ["policy"]
    assert len(agents) == 1
    assert (agents[0] is None) == lean, agents
