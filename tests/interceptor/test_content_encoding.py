"""A request body's Content-Encoding (`interceptor/wire/request_body.py`): gzip and deflate are undone; a coding the
server does not undo is a 415, a body that does not inflate a 400, one that inflates past the limit a 413, each in
the error shape of the client's dialect. Nothing is logged as an unhandled error and the keep-alive connection
answers the next request, with the fast lane and without it (the lane hands a compressed body to aiohttp).

Each case writes the bad request and then a good one on the same connection, as raw HTTP/1.1 bytes, to a real
server on loopback over the scripted upstream.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib

import orjson
import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.errors import ApiError
from interceptor.wire.dialects.registry import DIALECTS
from interceptor.wire.request_body import decoded

MAX_BODY = 64 * 1024
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "policy", "input": "hi"}
BODIES = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}  # one per registered dialect (a new one fails)

# name -> (body from a valid JSON body, Content-Encoding, status)
ENCODINGS = {
    "gzip_garbage": (lambda b: b, "gzip", 400),
    "gzip_truncated": (lambda b: gzip.compress(b)[:-6], "gzip", 400),
    "deflate_garbage": (lambda b: b"\x78\x9c" + b, "deflate", 400),
    "br": (lambda b: b, "br", 415),
    "zstd": (lambda b: b, "zstd", 415),
    "unknown": (lambda b: b, "x-fancy", 415),
    "gzip_over_the_limit": (lambda b: gzip.compress(b"[" + b" " * (4 * MAX_BODY) + b"]"), "gzip", 413),
    "gzip": (gzip.compress, "gzip", 200),
    "deflate": (zlib.compress, "deflate", 200),
    "gzip_then_deflate": (lambda b: gzip.compress(zlib.compress(b)), "deflate, gzip", 200),
}


@pytest.fixture(params=[True, False], ids=["fast_lane", "aiohttp_only"])
async def server(request, scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1), model_dir=tiny_model_dir,
                          max_body_bytes=MAX_BODY, fast_lane=request.param)
    async with InterceptionServer(config) as server:
        yield server


def _request(path: str, body: bytes, secret: str, encoding: str | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {secret}",
            "Content-Type: application/json", f"Content-Length: {len(body)}"]
    if encoding is not None:
        head.append(f"Content-Encoding: {encoding}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in head[1:] if line)
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    return int(head[0].split(" ")[1]), headers, await reader.readexactly(int(headers["content-length"]))


def _error_of(dialect: str, body: bytes) -> dict:
    """The error object in the dialect's shape (Anthropic's for messages, OpenAI's for the others)."""
    parsed = orjson.loads(body)
    if dialect == "messages":
        assert parsed["type"] == "error" and set(parsed["error"]) == {"type", "message"}, parsed
        return parsed["error"]
    assert set(parsed["error"]) == {"message", "type", "param", "code"}, parsed
    return parsed["error"]


@pytest.mark.parametrize("dialect", [d.name for d in DIALECTS])
@pytest.mark.parametrize("case", ENCODINGS)
async def test_a_bad_content_encoding_is_a_4xx_in_shape_and_the_connection_serves_the_next_request(
        server, scripted, case, dialect, caplog):
    caplog.set_level(logging.WARNING)
    make, encoding, expected = ENCODINGS[case]
    route, body = next(d.path for d in DIALECTS if d.name == dialect), BODIES[dialect]
    handle = server.open_rollout()
    path = f"/rollout/{handle.id}/v1/{route}"
    good = orjson.dumps({**body, "stream": False, "temperature": 0.5})  # another turn: not a retry of the first
    reader, writer = await asyncio.open_connection("127.0.0.1", server._port)
    try:
        writer.write(_request(path, make(orjson.dumps(body)), handle.secret, encoding)
                     + _request(path, good, handle.secret))
        status, headers, answer = await asyncio.wait_for(_answer(reader), 30)
        next_status, next_headers, next_answer = await asyncio.wait_for(_answer(reader), 30)
    finally:
        writer.close()
    assert status == expected, answer
    if expected != 200:
        error = _error_of(dialect, answer)
        assert encoding.split(",")[0].strip() in error["message"] or expected == 413, error
    assert headers.get("connection", "").lower() != "close"
    assert next_status == 200 and next_headers.get("connection", "").lower() != "close", next_answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def test_a_bad_content_encoding_on_the_admin_and_tool_routes_is_a_4xx_too(server, caplog):
    handle = server.open_rollout()
    reader, writer = await asyncio.open_connection("127.0.0.1", server._port)
    try:
        writer.write(_request(f"/rollout/{handle.id}/v1/tools/answer", b'{"answer": 1}', handle.tools_secret, "br")
                     + _request(f"/rollout/{handle.id}/v1/tools/answer", gzip.compress(b'{"answer": 42}'),
                                handle.tools_secret, "gzip"))
        refused = await asyncio.wait_for(_answer(reader), 30)
        answered = await asyncio.wait_for(_answer(reader), 30)
    finally:
        writer.close()
    assert refused[0] == 415 and orjson.loads(refused[2])["error"]["code"] == "unsupported_content_encoding"
    assert answered[0] == 200
    assert server.registry.get(handle.id).answer == 42
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(("raw", "coding", "expected"), [
    (gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", b"abcd"),  # two gzip members, one after the other
    (zlib.compress(b"ab")[2:-4], "deflate", b"ab"),  # raw deflate, as some clients send under this name
    (b"ab", "identity", b"ab"),
    (gzip.compress(b"ab"), "GZip", b"ab"),
    (gzip.compress(zlib.compress(b"ab")), "deflate, gzip", b"ab"),
])
def test_content_codings_are_undone(raw, coding, expected):
    assert decoded(raw, coding, limit=MAX_BODY) == expected


@pytest.mark.parametrize(("raw", "coding", "status"), [
    (zlib.compress(b"ab") + b"more", "deflate", 400),  # bytes after the deflate data
    (gzip.compress(b"ab") + b"more", "gzip", 400),  # not a second gzip member
    (b"", "gzip", 400),
    (gzip.compress(b"a" * (MAX_BODY + 1)), "gzip", 413),
    (gzip.compress(b"ab"), "gzip, br", 415),
])
def test_content_codings_that_cannot_be_undone_are_client_errors(raw, coding, status):
    with pytest.raises(ApiError) as raised:
        decoded(raw, coding, limit=MAX_BODY)
    assert raised.value.status == status
