"""Egress allow-lists: the hosts and ports a task's box may reach besides its model endpoint, and nothing else.

A box on the model-only network has loopback and its model endpoint; a task that needs more (a package mirror, a
test service) lists it, and its box gets an HTTP proxy as its one other way out, carried like the model endpoint:

    task:     "egress": ["pypi.internal:443", "10.0.0.7:8080", "*.mirror.example.org:443"]
    host:     EgressProxy(root / "egress.sock", policy)        # Unix socket -> the destinations the policy allows
    sandbox:  python -I netbridge.py --port 3128 --unix ROOT/egress.sock -- AGENT ARGV...
              HTTP_PROXY=HTTPS_PROXY=http://127.0.0.1:3128, NO_PROXY=127.0.0.1,localhost,::1 (the model)

The host half is the guard. It reads one proxy request per connection: `CONNECT host:port` (a tunnel, for TLS) or
an absolute-form `GET http://host:port/...` (sent on with its target in origin form and `Connection: close`). A
destination the policy does not list gets a 403 and is recorded (`refusals`: destination and why), as is one whose
name resolves to an address of this host (loopback, or any of its interfaces': the interception server listens on
them) or a link-local, unspecified or multicast one, which the list does not name literally (a listed wildcard
cannot be pointed at the host's own services). What passes is spliced both ways as bytes. A program that
ignores the proxy variables has no route at all: the box's network fails closed.

Entries: `host:port`, `host` (ports 80 and 443), `*.suffix[:port]` (any name under the suffix, not the suffix
itself), `[v6]:port`. Names are matched without case; the box names a destination, the host resolves it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from agents.errors import AgentConfigError
from agents.sandbox.netbridge import splice

__all__ = ["MAX_REFUSALS", "PROXY_PORT", "EgressPolicy", "EgressProxy", "Refusal", "proxy_env", "proxy_port"]

PROXY_PORT = 3128  # the proxy's port on the box's loopback (3129 where the model endpoint's is 3128)
MAX_REFUSALS = 64  # kept per box (a loop of refused connections counts on, unrecorded past it)
MAX_CONNECTIONS = 64  # open at once per box, as for the model endpoint
_CONNECT_S = 10.0
_HEAD_LIMIT = 64 * 1024
_NAME = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class _Entry:
    host: str  # lower case; "*.suffix" for a wildcard; an address's text for a literal
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    @property
    def literal(self) -> bool:
        """Names an address (or localhost) itself: its destination may be the host's own."""
        return self.host in _LOOPBACK_NAMES or _address(self.host) is not None


@dataclass(frozen=True)
class EgressPolicy:
    """The destinations a box may reach through its proxy. Empty: none (no proxy is started)."""

    entries: tuple[_Entry, ...] = ()

    @classmethod
    def parse(cls, entries: list[str] | tuple[str, ...]) -> EgressPolicy:
        if isinstance(entries, str) or not all(isinstance(entry, str) for entry in entries):
            raise AgentConfigError("egress must be a list of 'host:port' strings")
        return cls(tuple(_parse_entry(entry) for entry in entries))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def permits(self, host: str, port: int) -> _Entry | None:
        """The entry that lets `host:port` through, or None."""
        host = _normal_host(host)
        return next((entry for entry in self.entries if entry.matches(host, port)), None)

    def describe(self) -> list[str]:
        return [f"{entry.host}:{'/'.join(map(str, entry.ports))}" for entry in self.entries]


def _parse_entry(text: str) -> _Entry:
    entry = text.strip()
    if entry.startswith("["):  # [v6]:port
        host, sep, rest = entry[1:].partition("]")
        if not sep or _address(host) is None:
            raise AgentConfigError(f"egress entry {text!r}: not an IPv6 address in brackets")
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise AgentConfigError(f"egress entry {text!r}: expected ':port' after the address")
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep:
            host, port_text = entry, None
    host = _normal_host(host)
    if _address(host) is None and not _NAME.fullmatch(host):
        raise AgentConfigError(f"egress entry {text!r}: {host!r} is not a host name or address")
    if host.startswith("*.") and host.count(".") < 2:
        raise AgentConfigError(f"egress entry {text!r}: a wildcard needs a suffix of two labels at least")
    if port_text is None:
        return _Entry(host, (80, 443))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AgentConfigError(f"egress entry {text!r}: the port must be 1-65535")
    return _Entry(host, (int(port_text),))


def _normal_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def proxy_port(model_port: int | None) -> int:
    return PROXY_PORT + 1 if model_port == PROXY_PORT else PROXY_PORT


def proxy_env(port: int) -> dict[str, str]:
    """What points the box's programs at its proxy (both spellings: curl and pip read the lower-case ones). The box's
    loopback, where its model endpoint is, never goes through it."""
    url = f"http://127.0.0.1:{port}"
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "NO_PROXY": "127.0.0.1,localhost,::1"}
    return env | {key.lower(): value for key, value in env.items()}


@dataclass(frozen=True)
class Refusal:
    host: str
    port: int
    reason: str


class _Refused(Exception):
    def __init__(self, status: int, reason: str, host: str = "", port: int = 0) -> None:
        super().__init__(reason)
        self.status, self.reason, self.host, self.port = status, reason, host, port


class EgressProxy:
    """Host half: every connection to the Unix socket at `path` (mode 0600) is one proxy request, let through to
    a destination `policy` permits or refused and recorded."""

    def __init__(self, path: Path, policy: EgressPolicy, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.policy = policy
        self.max_connections = max_connections
        self.refusals: list[Refusal] = []  # the first MAX_REFUSALS, in order
        self.refused = 0  # all of them
        self.passed = 0  # connections let through
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    async def __aenter__(self) -> EgressProxy:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), limit=_HEAD_LIMIT)
        self.path.chmod(0o600)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await server.wait_closed()
        self.path.unlink(missing_ok=True)

    def _refuse(self, refused: _Refused) -> None:
        self.refused += 1
        if len(self.refusals) < MAX_REFUSALS:
            self.refusals.append(Refusal(refused.host, refused.port, refused.reason))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                if len(self._connections) > self.max_connections:
                    raise _Refused(503, f"this box holds its {self.max_connections} proxied connections already")
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    return
                method, host, port, head = _request(head)
                entry = self.policy.permits(host, port)
                if entry is None:
                    raise _Refused(403, "not on the task's egress list", host, port)
                upstream = await self._open(host, port, literal=entry.literal)
            except _Refused as refused:
                if refused.status == 403:
                    self._refuse(refused)
                writer.write(_reply(refused.status, refused.reason))
                return
            self.passed += 1
            if method == b"CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream[1].write(head)
            await splice((reader, writer), upstream)
        except asyncio.CancelledError:
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _open(self, host: str, port: int, *, literal: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the destination, by the addresses its name resolves to on this host; an address that is
        the host's own is refused unless the list names it literally."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(_CONNECT_S):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise _Refused(502, f"{host} could not be resolved: {exc}") from None
        addresses = [info[4][0] for info in infos]
        if not literal and any(_own(address) for address in addresses):
            raise _Refused(403, "resolves to this host's own address, which the list does not name", host, port)
        last: Exception | None = None
        for address in dict.fromkeys(addresses):
            try:
                async with asyncio.timeout(_CONNECT_S):
                    return await asyncio.open_connection(address, port, limit=_HEAD_LIMIT)
            except (OSError, TimeoutError) as exc:
                last = exc
        raise _Refused(502, f"{host}:{port} could not be reached: {last}")


def _own(address: str) -> bool:
    """An address of this host (any of its interfaces', loopback included) or none at all: where the interception
    server and the host's other services listen."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 (Python 3.11's is_loopback does not say so)
    if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return True
    return ip in _host_addresses()


def _host_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    families = (socket.AF_INET, socket.AF_INET6)
    return {ipaddress.ip_address(address.address.split("%", 1)[0])
            for addresses in psutil.net_if_addrs().values() for address in addresses if address.family in families}


def _request(head: bytes) -> tuple[bytes, str, int, bytes]:
    """(method, host, port, the head to send on) of a proxy request; _Refused(400) for anything else."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused(400, "not an HTTP/1.x proxy request")
    method, target, version = parts
    if method == b"CONNECT":
        host, port = _authority(target, default=None)
        return method, host, port, b""
    if not target.lower().startswith(b"http://"):
        raise _Refused(400, "a proxy request's target is 'http://host/...' (or CONNECT host:port, for TLS)")
    authority, slash, path = target[7:].partition(b"/")
    host, port = _authority(authority, default=80)
    headers = [header for header in rest.split(b"\r\n") if header and not header.lower().startswith(
        (b"proxy-connection:", b"proxy-authorization:", b"connection:", b"keep-alive:", b"host:"))]
    sent = b" ".join((method, slash + path or b"/", version))
    # The Host the destination sees is the one the request was let through for (RFC 9112 3.2.2).
    return method, host, port, b"\r\n".join((sent, b"Host: " + authority, *headers, b"Connection: close", b"", b""))


def _authority(authority: bytes, *, default: int | None) -> tuple[str, int]:
    text = authority.decode("ascii", "replace")
    if "@" in text:
        raise _Refused(400, "credentials in a proxy target are not accepted")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        if default is None:
            raise _Refused(400, "CONNECT needs host:port")
        return _normal_host(host), default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _Refused(400, f"{port_text!r} is not a port")
    return _normal_host(host), int(port_text)


def _reply(status: int, message: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = f"egress refused: {message}\n".encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body

