"""A lean HTTP/1.1 client for the policy server's JSON calls: a keep-alive connection pool to one `http://` host.

    async with Http1Pool("http://127.0.0.1:8000", limit=256, connect_timeout_s=10) as pool:
        status, body = await pool.request(b"POST", "/v1/completions", data, {"Content-Type": "application/json"})

Every turn of the interception gate makes one `/v1/completions` call, and on a busy gate aiohttp's client was the
largest single cost (18% of the process, `bench/README.md`): per call it builds a request and a response object,
header multidicts, timers and trace hooks. This path needs none of that: one host, plain http, a body in, a whole
body out, no redirects, cookies, proxies or streaming. Here a call is one write (request line, headers, body) and
two reads (the head up to its blank line, then `Content-Length` bytes or the chunks).

What it answers: `(status, body)`, the body whole (gzip or deflate undone). What it raises: `HttpError` when the
connection cannot be made, breaks, or the answer is not HTTP/1.1 it can read (the caller retries it like a reset),
and `TimeoutError` when `timeout_s` passes (never retried: a generation that slow is not sped up by a second one).
A pooled connection the server has closed while it idled is dropped when it is next taken; every failure is the
caller's to retry (so each try counts against the caller's budget, as with aiohttp). A connection is pooled again
only after a whole answer that does not ask to close it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["Http1Pool", "HttpError", "lean_client_serves"]

_MAX_HEAD = 64 * 1024  # bytes of status line and headers; an answer with more is refused
_JOINED_BODY_MAX = 16 * 1024  # a body up to this size goes out in one piece with the head (one send, not two)


class HttpError(Exception):
    """The connection failed, or the answer is not HTTP/1.1 this client reads."""


def lean_client_serves(url: str) -> bool:
    """Whether `Http1Pool` can talk to `url`: plain http without credentials in the URL (those go to aiohttp)."""
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.username is None and parts.password is None and bool(parts.hostname)


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def usable(self) -> bool:
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()


class Http1Pool:
    def __init__(self, root: str, *, limit: int, connect_timeout_s: float) -> None:
        if not lean_client_serves(root):
            raise ValueError(f"the lean HTTP client takes plain http URLs without credentials, not {root!r}")
        parts = urlsplit(root)
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc.encode("ascii")
        self._connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []
        self._closed = False

    async def __aenter__(self) -> Http1Pool:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def request(
        self, method: bytes, path: str, body: bytes | None, headers: Mapping[str, str], *, timeout_s: float
    ) -> tuple[int, bytes]:
        """The answer's status and whole body, within `timeout_s` (the wait for a free connection included)."""
        if self._closed:
            raise RuntimeError("Http1Pool used after close")
        head = self._head(method, path, body, headers)
        async with asyncio.timeout(timeout_s), self._slots:
            return await self._exchange(await self._connection(), head, body)

    def _head(self, method: bytes, path: str, body: bytes | None, headers: Mapping[str, str]) -> bytes:
        lines = [method, b" ", (self._prefix + path).encode("ascii"), b" HTTP/1.1\r\nHost: ", self._host_header,
                 b"\r\nAccept-Encoding: gzip, deflate\r\n"]
        for name, value in headers.items():
            lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        if body is not None:
            lines += (b"Content-Length: ", str(len(body)).encode(), b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
            connection.close()  # the server closed it while it idled (or sent what nobody asked for)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(self._host, self._port, limit=_MAX_HEAD)
        except TimeoutError as exc:
            raise HttpError(f"connecting to {self._host}:{self._port} took over {self._connect_timeout_s}s") from exc
        except OSError as exc:
            raise HttpError(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, head: bytes, body: bytes | None) -> tuple[int, bytes]:
        keep = False
        try:
            writer = connection.writer
            joined = body is not None and len(body) <= _JOINED_BODY_MAX
            writer.write(head + body if joined else head)
            if body is not None and not joined:
                writer.write(body)
            await writer.drain()
            status, fields = await _read_head(connection.reader)
            payload, keep = await _read_body(connection.reader, status, fields)
        except TimeoutError:  # an OSError by inheritance, but a time limit: never retried
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise HttpError(_describe(exc)) from exc
        finally:
            if keep and not self._closed:
                self._idle.append(connection)
            else:
                connection.close()
        return status, payload


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """The status and header fields (names lower-cased) of the final answer; 1xx interim answers are skipped."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 or status_line[12:13] not in (b" ", b""):
            raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(status_line[9:12])
        fields: dict[bytes, bytes] = {b"": status_line[5:8]}  # the version, under a name no header has
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name[-1:].isspace():
                raise ValueError(f"a malformed header line: {line[:80]!r}")
            name = name.lower()
            value = value.strip()
            fields[name] = fields[name] + b", " + value if name in fields else value
        if not 100 <= status < 200 or status == 101:
            return status, fields


async def _read_body(reader: asyncio.StreamReader, status: int, fields: dict[bytes, bytes]) -> tuple[bytes, bool]:
    """The body (decoded) and whether the connection can carry another request."""
    connection = fields.get(b"connection", b"").lower()
    keep = b"close" not in connection and (fields[b""] == b"1.1" or b"keep-alive" in connection)
    if status in (204, 304):
        return b"", keep
    coding = fields.get(b"transfer-encoding", b"").lower()
    if coding:
        if coding != b"chunked":
            raise ValueError(f"an unsupported transfer-encoding: {coding[:40]!r}")
        payload = await _read_chunks(reader)
    elif (length := fields.get(b"content-length")) is not None:
        if not length.isdigit():
            raise ValueError(f"a malformed content-length: {length[:40]!r}")
        payload = await reader.readexactly(int(length))
    else:  # the body runs to the end of the connection
        payload = await reader.read()
        keep = False
    return _decoded(payload, fields.get(b"content-encoding", b"").lower()), keep


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, ignored
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("a chunk does not end with CRLF")


def _decoded(payload: bytes, coding: bytes) -> bytes:
    if coding in (b"", b"identity"):
        return payload
    if coding in (b"gzip", b"x-gzip", b"deflate"):
        try:
            return zlib.decompress(payload, 47)  # gzip or zlib, told apart by the header
        except zlib.error:
            if coding == b"deflate":  # servers that send raw deflate under this name
                try:
                    return zlib.decompress(payload, -15)
                except zlib.error as exc:
                    raise ValueError(f"a deflate body that does not inflate: {exc}") from exc
            raise ValueError("a gzip body that does not inflate") from None
    raise ValueError(f"an unsupported content-encoding: {coding[:40]!r}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return f"the connection closed after {len(exc.partial)} of the answer's bytes"
    if isinstance(exc, asyncio.LimitOverrunError):
        return f"an answer whose head (status line and headers) or chunk-size line is over {_MAX_HEAD} bytes"
    return f"{type(exc).__name__}: {exc}"
