"""The one way out of a sandbox's private network: its model endpoint, carried over a Unix socket.

A namespace sandbox has its own network namespace with nothing but loopback, so no host port is reachable from it.
Its rollout's endpoint (the interception server, e.g. 127.0.0.1:8000) is carried in two halves:

    host:     UnixBridge(root / "model.sock", endpoint=("127.0.0.1", 8000))   # unix socket -> TCP endpoint
    sandbox:  python -I agents/sandbox/netbridge.py --port 8000 --unix ROOT/model.sock -- AGENT ARGV...

Inside, this module run as a script listens on 127.0.0.1:PORT (and [::1]:PORT where the namespace has IPv6, for
agents that resolve `localhost` to ::1 first, as Node does), forks a forwarder that sends every connection to the
bind-mounted Unix socket, and execs the agent. The agent's unchanged base URL `http://127.0.0.1:PORT/...` works;
every other port on its loopback is closed, and the host's are in another namespace. The forwarder is a child of
what it execs (the sandbox's subreaper), so it ends with the agent's tree.

The host half is the guard, since everything inside is the agent's: it forwards HTTP/1.1 requests whose target is
a rollout's route (`/rollout/<id>/...`) and nothing else, so `/metrics`, `/health`, the admin routes and mounted
pages of the server are not reachable from a box (a request for one gets a 404 in the OpenAI error shape on a
connection's first request, and the connection closed). It reads each request's framing (Content-Length or chunked,
never both) to find the next request on a kept-alive connection; bodies pass through as they come. And it holds at
most `max_connections` open to the endpoint for its box: past that a connection gets a 503 and is closed, and is
counted (`refused`), so one rollout cannot take the server's file descriptors.

Stdlib only: this file also runs as a plain script, without the package on sys.path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import sys
from urllib.parse import urlsplit, urlunsplit
from pathlib import Path

__all__ = ["BridgeSet", "UnixBridge", "endpoint_of", "host_target", "main", "on_loopback", "splice"]

_CHUNK = 64 * 1024
_CONNECT_S = 10.0  # to the endpoint; a connection the server does not take by then is dropped (the agent retries)
_BACKLOG = 128  # a group of rollouts' agents can open many connections at once
# One box's open connections to its endpoint. An agent keeps a few (OpenCode's title request beside its turn, parallel
# sub-agents); one rollout that opened 7,000 took the server to its file-descriptor limit.
MAX_CONNECTIONS = 64
_ANSWER_GRACE_S = 2.0  # for the answers to forwarded requests, once a connection's next request is refused
_HEAD_LIMIT = 64 * 1024  # a request head's bytes (aiohttp's own limit is 8 KiB a line)
_ROLLOUT_TARGET = re.compile(rb"/rollout/[A-Za-z0-9_-]+/[A-Za-z0-9_./~-]*(\?[^#\s]*)?")


class UnixBridge:
    """Host half: every connection to the Unix socket at `path` (mode 0600) is forwarded to `endpoint`."""

    def __init__(self, path: Path, *, endpoint: tuple[str, int], max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.endpoint = endpoint
        self.max_connections = max_connections
        self.refused = 0  # connections turned away for being past `max_connections`
        self.rejected = 0  # requests for a route that is not a rollout's
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    async def __aenter__(self) -> UnixBridge:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), backlog=_BACKLOG,
                                                       limit=_HEAD_LIMIT)
        os.chmod(self.path, 0o600)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            # Before 3.12 wait_closed does not wait for the open connections: end them ourselves.
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.max_connections:
            self.refused += 1
            writer.write(_error(503, "Service Unavailable", f"this sandbox holds its {self.max_connections} "
                                "connections to the model endpoint already"))
            writer.close()
            return
        self._connections.add(task)
        try:
            first = await _read_head(reader)
            if first is None:
                return
            if not _allowed(first):
                self.rejected += 1
                writer.write(_error(404, "Not Found", "only the rollout's own routes are reachable from a sandbox"))
                return
            try:
                async with asyncio.timeout(_CONNECT_S):
                    upstream = await asyncio.open_connection(*self.endpoint)
            except OSError:  # TimeoutError included: the agent sees a closed connection, as from a down server
                return
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._requests(first, reader, upstream[1]))
                    group.create_task(_copy(upstream[0], writer))
            finally:
                upstream[1].close()
        except asyncio.CancelledError:
            # Only `__aexit__` cancels a connection. Ended as cancelled, Python 3.11's start_unix_server logs the
            # handler's CancelledError as an "Exception in callback" with a traceback: end it as returned instead.
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _requests(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward requests, `head` first, while each one is for a rollout's route; the first that is not ends the
        connection (in the middle of a kept-alive one, a response cannot be slipped in: it is closed)."""
        try:
            while True:
                framing = _framing(head)
                if framing is None:
                    self.rejected += 1
                    break
                writer.write(head)
                await _copy_body(reader, writer, framing)
                await writer.drain()
                next_head = await _read_head(reader)
                if next_head is None:
                    if writer.can_write_eof():
                        writer.write_eof()  # the half-close passed on: the client may wait for the reply
                    return
                if not _allowed(next_head):
                    self.rejected += 1
                    break
                head = next_head
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        # Nothing more goes to the server; what it answers to the requests already forwarded still comes back, for a
        # moment, then the connection is closed whatever it still holds.
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()
        await asyncio.sleep(_ANSWER_GRACE_S)
        writer.close()


_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def splice(a: _Stream, b: _Stream) -> None:
    """Copy both ways until both directions have ended, then close `b` (the caller owns `a`)."""
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(_copy(a[0], b[1]))
            group.create_task(_copy(b[0], a[1]))
    finally:
        b[1].close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # pass the half-close on: an HTTP client may wait for the reply after sending EOF
    except OSError:  # a reset on either side ends this direction; the other ends at its own EOF or reset
        writer.close()


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next request's head, through its blank line; None at a clean end of the connection (or a head that is
    cut off or too long: the connection is not worth keeping)."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        return None


def _allowed(head: bytes) -> bool:
    """A request for a rollout's route: an origin-form target under /rollout/<id>/, with no dot segment or escaped
    separator that a server could resolve to another route."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return False
    target = parts[1]
    if _ROLLOUT_TARGET.fullmatch(target) is None:
        return False
    path = target.split(b"?", 1)[0]
    return b"/./" not in path + b"/" and b"/../" not in path + b"/" and b"//" not in path


def _framing(head: bytes) -> int | str | None:
    """How the request's body is framed: its length, "chunked", or None when it cannot be told safely (both
    headers, several lengths, an encoding other than chunked)."""
    lengths: set[bytes] = set()
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            lengths.add(value)
        elif name == b"transfer-encoding":
            if value.lower() != b"chunked":
                return None
            chunked = True
    if chunked:
        return None if lengths else "chunked"
    if not lengths:
        return 0
    if len(lengths) > 1:
        return None
    (length,) = lengths
    return int(length) if length.isdigit() else None


async def _copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: int | str) -> None:
    if framing == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:  # the trailers, through their blank line
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(line)
                writer.write(line)
                return
            await _copy_exactly(reader, writer, size + 2)  # the chunk and its CRLF
    else:
        assert isinstance(framing, int)
        await _copy_exactly(reader, writer, framing)


async def _copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: int) -> None:
    while count:
        data = await reader.read(min(count, _CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", count)
        writer.write(data)
        await writer.drain()
        count -= len(data)


def _error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": None}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


class BridgeSet:
    """One sandbox's host halves, one per endpoint, each opened on first use and kept until `aclose` (its runs, and
    a warm spare started during a run, share them). Sockets are `directory/model-N.sock`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: dict[tuple[str, int], UnixBridge] = {}

    async def socket_for(self, endpoint: tuple[str, int]) -> Path:
        bridge = self._open.get(endpoint)
        if bridge is None:
            bridge = UnixBridge(self.directory / f"model-{len(self._open)}.sock", endpoint=endpoint)
            await bridge.__aenter__()
            self._open[endpoint] = bridge
        return bridge.path

    def refused(self) -> int:
        """Connections turned away so far, over this sandbox's bridges (past their `max_connections`)."""
        return sum(bridge.refused for bridge in self._open.values())

    async def aclose(self) -> None:
        bridges, self._open = list(self._open.values()), {}
        for bridge in bridges:
            await bridge.__aexit__(None, None, None)


# ------------------------------------------------------------------------------------------ inside the sandbox


def _listen(port: int) -> list[socket.socket]:
    sockets = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            sock.listen(_BACKLOG)
        except OSError:
            sock.close()
            if family == socket.AF_INET:
                raise  # 127.0.0.1 is the address the agent is given: without it nothing works
            continue
        sockets.append(sock)
    return sockets


async def _forward(sockets: list[socket.socket], unix_path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host_side = await _connect_unix(unix_path)
        except OSError:
            writer.close()
            return
        try:
            await splice(host_side, (reader, writer))
        finally:
            host_side[1].close()

    servers = [await asyncio.start_server(handle, sock=sock) for sock in sockets]
    await asyncio.gather(*(server.serve_forever() for server in servers))


async def _connect_unix(path: str) -> _Stream:
    """The socket's server may come up after the agent: a box that shares no file system with the host serves it
    from inside (`agents.sandbox.stdiomux`, started once the container runs). Tried for up to `_CONNECT_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CONNECT_S
    while True:
        try:
            return await asyncio.open_unix_connection(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="forward 127.0.0.1:PORT to a Unix socket, then exec a command")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix", required=True, help="the host bridge's socket, bind-mounted into the sandbox")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    try:
        sockets = _listen(args.port)  # bound before the agent starts: its first request cannot race the forwarder
    except OSError as exc:
        print(f"netbridge: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    if os.fork() == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):  # the agent's stdout is its own; the forwarder keeps stderr for a traceback
            os.dup2(devnull, fd)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_forward(sockets, args.unix))
        os._exit(0)
    for sock in sockets:
        sock.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"netbridge: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
    return 127


# ------------------------------------------------------------------------------- addresses, for the backends

_LOOPBACK = "127.0.0.1"
_ANY_HOST = ("", "0.0.0.0", "::")  # a server bound to every address is reached on the host through loopback


def endpoint_of(base_url: str | None) -> tuple[str, int] | None:
    """(host, port) of a base URL, or None without one."""
    if not base_url:
        return None
    url = urlsplit(base_url)
    if url.hostname is None:
        return None
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def host_target(host: str, port: int) -> tuple[str, int]:
    """Where the host side of the bridge connects for an endpoint (a wildcard bind is reached on loopback)."""
    return (_LOOPBACK if host in _ANY_HOST else host, port)


def on_loopback(base_url: str) -> str:
    """The base URL with its host replaced by 127.0.0.1, where the bridge listens inside a sandbox."""
    url = urlsplit(base_url)
    if url.hostname in (None, _LOOPBACK):
        return base_url
    netloc = _LOOPBACK if url.port is None else f"{_LOOPBACK}:{url.port}"
    if url.username or url.password:
        netloc = f"{url.netloc.rpartition('@')[0]}@{netloc}"
    return urlunsplit(url._replace(netloc=netloc))


if __name__ == "__main__":
    sys.exit(main())
