"""The fast lane: the requests the server routes to it are answered straight off the socket; aiohttp serves the rest.

    routes = LaneRoutes()                                                   # lane_routes.py
    routes.add("POST", "/rollouts/{rid}/finish", from_aiohttp(finish))     # an aiohttp handler that answers JSON
    lane = await Lane.start(runner.server, host="127.0.0.1", port=0, take=routes.take, on_error=answer_error,
                            max_body_bytes=16 << 20)                        # runner.server: aiohttp's protocols
    ...
    await lane.aclose(grace_s=5)           # stops listening, lets answers in progress finish, closes its sockets

aiohttp's server around a handler cost about as much as a steady turn's own work (`bench/README.md`). The lane is
the listening socket's protocol. It reads each request's head itself and asks `take(method, path)` for a handler
(the server offers the gate's turns and its JSON routes), and serves the request when it reads it whole:

    HTTP/1.1; no query string; a Content-Length body within `max_body_bytes`; no Transfer-Encoding, Expect,
    Upgrade or Content-Encoding; header lines that parse (`name: value`, no folding).

Anything else (another route, a request the lane does not read) hands the connection to aiohttp with every byte
read so far, as if aiohttp had accepted it, and the connection stays with aiohttp from then on. So aiohttp answers
every request the lane does not, the way it always did: chunked or compressed bodies, oversized ones, malformed
heads, black_box turns, /metrics, the viewer.

A handler's answer is `LaneReply` (a status and a body), or a `LaneStream` it opened and finished (a streamed
turn's events, sent chunked); what it raises is turned into a `LaneReply` by `on_error` (the same status and body
the error middleware gives). One request per connection is in hand at a time: pipelined requests wait their turn
(in the socket). A handler runs to its end even if the client hangs up (the server's `handler_cancellation=False`):
the turn is recorded, and a retry is answered from it. An idle connection is closed after `keepalive_s` (75 s).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

from multidict import CIMultiDict, CIMultiDictProxy

from interceptor.errors import Overloaded
from interceptor.wire.body_budget import BodyBudget

__all__ = ["Handler", "Lane", "LaneReply", "LaneRequest", "LaneStream"]

log = logging.getLogger("interceptor.transport.lane")

_MAX_HEAD = 64 * 1024  # request line and headers; a longer head is aiohttp's to refuse
_TARGET = re.compile(rb"/[!$&'()*+,\-./0-9:;=@A-Z_a-z~]*")  # an origin-form path, no query, escape or control byte
# Header lines, each ending in CRLF: a name (RFC 9110's token), a colon, a value with no control bytes but tab
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus} | {529: b"Overloaded"}  # 529: Anthropic's
_REFUSED = frozenset(("transfer-encoding", "expect", "upgrade", "content-encoding"))  # aiohttp's to read


@dataclass(slots=True)
class LaneRequest:
    """What a lane handler sees: the parts of aiohttp's request the server's handlers read."""

    method: str
    path: str
    headers: CIMultiDictProxy[str]
    body: bytes
    match_info: dict[str, str] = field(default_factory=dict)
    _connection: _LaneConnection | None = field(default=None, repr=False)

    async def read(self) -> bytes:
        return self.body

    @property
    def transport(self) -> asyncio.Transport | None:  # None, or closing, once the client has gone
        return self._connection.transport if self._connection is not None else None

    async def open_stream(self, status: int, headers: Mapping[str, str]) -> LaneStream:
        """Send the status and headers of an answer whose body follows in pieces (chunked): a handler that uses
        this answers through the stream and returns it, finished."""
        return self._connection.open_stream(status, headers)


class LaneStream:
    """An answer sent in pieces. Its head goes out with the first piece; a write to a client that is gone raises
    ConnectionResetError, as aiohttp's does."""

    __slots__ = ("_connection", "_pending", "finished")

    def __init__(self, connection: _LaneConnection, head: bytes) -> None:
        self._connection = connection
        self._pending = head
        self.finished = False

    async def write(self, data: bytes) -> None:
        if data:
            self._send(b"%x\r\n%s\r\n" % (len(data), data))

    async def write_eof(self) -> None:
        self._send(b"0\r\n\r\n")
        self.finished = True

    def _send(self, data: bytes) -> None:
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(self._pending + data)
        self._pending = b""


@dataclass(frozen=True, slots=True)
class LaneReply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    on_sent: Callable[[], None] | None = None  # called once the answer is handed to the socket


Handler = Callable[[LaneRequest], Awaitable[LaneReply | LaneStream]]
Take = Callable[[str, str], tuple[Handler, dict[str, str]] | None]  # (method, path) -> (handler, path parameters)
OnError = Callable[[LaneRequest, Exception], LaneReply]


class _Date:
    """The Date header, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = formatdate(now, usegmt=True).encode("ascii")
        return self._value


class Lane:
    def __init__(self, fallback: Callable[[], asyncio.Protocol], *, take: Take, on_error: OnError,
                 max_body_bytes: int, keepalive_s: float = 75.0, budget: BodyBudget | None = None) -> None:
        self._fallback = fallback  # aiohttp's server: makes the protocol a handed-over connection continues with
        self._take = take
        self._on_error = on_error
        self._max_body = max_body_bytes
        self._budget = budget  # what bodies still arriving may hold, with aiohttp's (`body_budget.py`)
        self._keepalive_s = keepalive_s
        self._date = _Date()
        self._connections: set[_LaneConnection] = set()
        self._server: asyncio.Server | None = None
        self.served = 0  # requests the lane answered itself
        self.handed_over = 0  # connections given to aiohttp

    @classmethod
    async def start(cls, fallback: Callable[[], asyncio.Protocol], *, host: str, port: int, **options) -> Lane:
        lane = cls(fallback, **options)
        loop = asyncio.get_running_loop()
        lane._server = await loop.create_server(lambda: _LaneConnection(lane), host, port, reuse_address=True)
        return lane

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop listening; answers in progress get `grace_s`, then are cancelled; every connection the lane holds
        is closed."""
        if self._server is None:
            return
        log.info("fast lane: %d requests answered, %d connections handed to aiohttp", self.served, self.handed_over)
        self._server.close()
        busy = [c.task for c in self._connections if c.task is not None]
        for connection in [c for c in self._connections if c.task is None]:
            connection.close()
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace_s)
            for task in late:  # past the grace, as aiohttp does with its own handlers
                task.cancel()
            if late:
                await asyncio.wait(late)
        for connection in list(self._connections):
            connection.close()
        self._server = None


class _LaneConnection(asyncio.Protocol):
    __slots__ = ("lane", "transport", "buffer", "consumed", "task", "stream", "paused", "idle", "closing", "eof",
                 "reserved")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.consumed = 0  # the buffer's bytes that are the request in hand
        self.task: asyncio.Task | None = None  # the request in hand
        self.stream: LaneStream | None = None  # its answer, when it is sent in pieces
        self.paused = False  # reading paused: the client sent far ahead of the request in hand
        self.idle: asyncio.TimerHandle | None = None
        self.closing = False  # answer this request, then close (Connection: close, or the client's EOF)
        self.eof = False
        self.reserved = 0  # the declared length of a body still arriving, held in the lane's budget

    # ------------------------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an answer is one small write: send it now
        self.lane._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lane._connections.discard(self)
        self._disarm_idle()
        self._release()
        self.transport = None  # a handler in progress runs on; its answer is dropped

    def eof_received(self) -> bool:
        self.eof = True
        if self.task is not None:  # the client sent its request and half-closed: answer, then close
            self.closing = True
            return True
        return False

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.task is None:
            self._next()
        elif len(self.buffer) > self.consumed + _MAX_HEAD and not self.paused:
            self.paused = True  # pipelined bytes wait in the socket, not here (pausing for every request costs)
            self.transport.pause_reading()

    # ------------------------------------------------------------------------------------------ requests

    def _next(self) -> None:
        """Serve the request at the head of the buffer if it is whole and the lane's, or hand the connection over."""
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > _MAX_HEAD:
                self._hand_over()
            return
        parsed = self._read_head(bytes(buffer[:end]))
        if parsed is None:
            self._hand_over()
            return
        method, path, headers, length, handler, params = parsed
        if len(buffer) < end + 4 + length:  # the body is still coming: it holds its length of the budget meanwhile
            budget = self.lane._budget
            if not self.reserved and budget is not None:
                if not budget.take(length):
                    request = LaneRequest(method, path, headers, b"", params, self)
                    self._refuse(request, Overloaded(budget.refusal(length)))
                    return
                self.reserved = length
            return
        self._release()
        request = LaneRequest(method, path, headers, bytes(buffer[end + 4:end + 4 + length]), params, self)
        self._disarm_idle()
        self.consumed = end + 4 + length
        self.task = asyncio.get_running_loop().create_task(self._serve(handler, request))

    def _release(self) -> None:
        if self.reserved:
            self.lane._budget.give(self.reserved)
            self.reserved = 0

    def _refuse(self, request: LaneRequest, error: Exception) -> None:
        """Answer `error` in the route's own shape without reading the body, and close (the answer is sent first)."""
        self.closing = True
        self._write(self.lane._on_error(request, error))
        self.close()

    def _read_head(self, head: bytes):
        request_line, _, fields = head.partition(b"\r\n")
        parts = request_line.split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not _TARGET.fullmatch(parts[1]):
            return None
        if fields and not _HEADER_LINES.fullmatch(fields + b"\r\n"):
            return None  # folding, a space before the colon, no colon, a control byte: aiohttp's to refuse
        method, path = parts[0].decode("latin-1"), parts[1].decode("latin-1")
        taken = self.lane._take(method, path)
        if taken is None:
            return None
        # decoded as aiohttp decodes them: UTF-8, with a byte that is not UTF-8 kept as a surrogate
        headers: CIMultiDict[str] = CIMultiDict([
            (name.decode("ascii"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
            for name, _, value in (line.partition(b":") for line in fields.split(b"\r\n"))
        ] if fields else ())
        if any(name in headers for name in _REFUSED):
            return None
        lengths = headers.getall("Content-Length", ())
        if len(lengths) > 1 or (lengths and not (lengths[0].isdigit() and lengths[0].isascii())):
            return None
        length = int(lengths[0]) if lengths else 0  # neither Content-Length nor Transfer-Encoding: no body
        if length > self.lane._max_body:
            return None
        if headers.get("Connection", "").lower() == "close":
            self.closing = True
        return method, path, CIMultiDictProxy(headers), length, *taken

    async def _serve(self, handler: Handler, request: LaneRequest) -> None:
        """Answer one request, the buffer's first `consumed` bytes."""
        self.stream = None
        try:
            try:
                reply = await handler(request)
            except ConnectionError:  # the client went away while its answer was being sent
                self.close()
                return
            except Exception as exc:
                if self.stream is not None:
                    raise  # the head is out: the error cannot be the answer
                reply = self.lane._on_error(request, exc)
            if self.stream is None:
                self._write(reply)
            elif not self.stream.finished:
                raise RuntimeError("a streamed answer was left unfinished")
        except Exception:  # a defect: the connection cannot be trusted to be in step
            log.exception("the fast lane failed on %s %s", request.method, request.path)
            self.close()
            return
        finally:
            self.task = None
        self.lane.served += 1
        if self.transport is None:
            return
        if self.closing:
            self.transport.close()
            return
        del self.buffer[:self.consumed]
        self.consumed = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        self._arm_idle()
        if self.buffer:
            self._next()

    def open_stream(self, status: int, headers: Mapping[str, str]) -> LaneStream:
        self.stream = LaneStream(self, self._head(status, b"Transfer-Encoding: chunked\r\n", headers.items()))
        return self.stream

    def _write(self, reply: LaneReply) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        framing = b"Content-Type: %s\r\nContent-Length: %d\r\n" % (reply.content_type.encode("latin-1"),
                                                                      len(reply.body))
        self.transport.write(self._head(reply.status, framing, reply.headers) + reply.body)
        if reply.on_sent is not None:
            reply.on_sent()

    def _head(self, status: int, framing: bytes, headers) -> bytes:
        """An answer's status line and headers: `framing` (how its body is delimited), Date, `headers`, and
        Connection: close when the connection ends after it."""
        head = [b"HTTP/1.1 %d %s\r\n%sDate: %s\r\n"
                % (status, _REASONS.get(status, b"Status"), framing, self.lane._date())]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers]
        if self.closing:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    # ---------------------------------------------------------------------------------- hand-over, idling

    def _hand_over(self) -> None:
        """aiohttp's protocol takes the connection from here, with the bytes read so far as its first data."""
        transport = self.transport
        if transport is None:
            return
        self._disarm_idle()
        self.closing = False
        self.paused = False
        self.lane._connections.discard(self)
        self.lane.handed_over += 1
        protocol = self.lane._fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        data, self.buffer = bytes(self.buffer), bytearray()
        self.transport = None
        if data:
            protocol.data_received(data)
        if self.eof:
            protocol.eof_received()
        transport.resume_reading()

    def _arm_idle(self) -> None:
        self._disarm_idle()
        self.idle = asyncio.get_running_loop().call_later(self.lane._keepalive_s, self.close)

    def _disarm_idle(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None

    def close(self) -> None:
        self._disarm_idle()
        if self.transport is not None:
            self.transport.close()
