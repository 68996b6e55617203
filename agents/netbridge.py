"""The one way out of a sandbox's private network: its model endpoint, carried over a Unix socket.

A namespace sandbox has its own network namespace with nothing but loopback, so no host port is reachable from it.
Its rollout's endpoint (the interception server, e.g. 127.0.0.1:8000) is carried in two halves:

    host:     UnixBridge(root / "model.sock", endpoint=("127.0.0.1", 8000))   # unix socket -> TCP endpoint
    sandbox:  python -I agents/netbridge.py --port 8000 --unix ROOT/model.sock -- AGENT ARGV...

Inside, this module run as a script listens on 127.0.0.1:PORT (and [::1]:PORT where the namespace has IPv6, for
agents that resolve `localhost` to ::1 first, as Node does), forks a forwarder that sends every connection to the
bind-mounted Unix socket, and execs the agent. The agent's unchanged base URL `http://127.0.0.1:PORT/...` works;
every other port on its loopback is closed, and the host's are in another namespace. The forwarder is a child of
what it execs (the sandbox's subreaper), so it ends with the agent's tree.

Stdlib only: this file also runs as a plain script, without the package on sys.path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from urllib.parse import urlsplit, urlunsplit
from pathlib import Path

__all__ = ["BridgeSet", "UnixBridge", "endpoint_of", "host_target", "main", "on_loopback"]

_CHUNK = 64 * 1024
_CONNECT_S = 10.0  # to the endpoint; a connection the server does not take by then is dropped (the agent retries)
_BACKLOG = 128  # a group of rollouts' agents can open many connections at once


class UnixBridge:
    """Host half: every connection to the Unix socket at `path` (mode 0600) is forwarded to `endpoint`."""

    def __init__(self, path: Path, *, endpoint: tuple[str, int]) -> None:
        self.path = path
        self.endpoint = endpoint
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    async def __aenter__(self) -> UnixBridge:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), backlog=_BACKLOG)
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
        self._connections.add(task)
        try:
            try:
                async with asyncio.timeout(_CONNECT_S):
                    upstream = await asyncio.open_connection(*self.endpoint)
            except OSError:  # TimeoutError included: the agent sees a closed connection, as from a down server
                return
            await _splice((reader, writer), upstream)
        finally:
            self._connections.discard(task)
            writer.close()


_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _splice(a: _Stream, b: _Stream) -> None:
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
            host_side = await asyncio.open_unix_connection(unix_path)
        except OSError:
            writer.close()
            return
        try:
            await _splice(host_side, (reader, writer))
        finally:
            host_side[1].close()

    servers = [await asyncio.start_server(handle, sock=sock) for sock in sockets]
    await asyncio.gather(*(server.serve_forever() for server in servers))


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
