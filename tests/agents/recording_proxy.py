"""A pass-through HTTP proxy in front of the interception server that keeps every request an agent sends.

The e2e agent tests need what the server does not keep: the full first request (system prompt and `tools`), the
arrival time of each request, and a heartbeat for the sandbox's idle watchdog. The proxy forwards each request
unchanged and streams the response back as the bytes arrive (SSE keepalive comments included), so the agent sees
the server exactly as it would without it.

    async with RecordingProxy(target=server.url, on_activity=heartbeat.beat) as proxy:
        base_url = proxy.rebase(handle.base_url)      # the same path, through the proxy
        ...
        proxy.chat_requests[0].body["tools"]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

__all__ = ["CapturedRequest", "RecordingProxy"]

# Hop-by-hop headers (RFC 9110 7.6.1) and ones aiohttp recomputes for the re-encoded body.
_DROPPED_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade"}
)


@dataclass(kw_only=True)
class CapturedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None  # the JSON body, None when there was none
    at: float  # time.monotonic() on arrival
    raw: bytes = b""  # the body as sent
    status: int | None = None  # the server's status, once its headers came back
    response: bytearray = field(default_factory=bytearray)  # the bytes passed back, SSE comments included
    done: float | None = None  # time.monotonic() once the whole response was passed back


class RecordingProxy:
    def __init__(self, *, target: str, on_activity: Callable[[], None] | None = None) -> None:
        self.target = target.rstrip("/")
        self.requests: list[CapturedRequest] = []
        self.first_request = asyncio.Event()
        self._on_activity = on_activity or (lambda: None)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def chat_requests(self) -> list[CapturedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def rebase(self, base_url: str) -> str:
        """The agent's base URL with the server's origin replaced by the proxy's."""
        if not base_url.startswith(self.target):
            raise ValueError(f"{base_url!r} is not under {self.target!r}")
        return self.url + base_url[len(self.target) :]

    async def __aenter__(self) -> RecordingProxy:
        # No total timeout: a slow generation is kept alive by the server's keepalive comments.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        try:
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
        except BaseException:
            await self.__aexit__()
            raise
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        captured = CapturedRequest(
            method=request.method,
            path=request.path,
            headers=dict(request.headers),
            body=orjson.loads(raw) if raw.strip() else None,
            at=time.monotonic(),
            raw=raw,
        )
        self.requests.append(captured)
        self.first_request.set()
        self._on_activity()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_HEADERS}
        assert self._session is not None
        async with self._session.request(
            request.method, self.target + request.path_qs, headers=headers, data=raw
        ) as upstream:
            captured.status = upstream.status
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED_HEADERS},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                self._on_activity()
                captured.response += chunk
                await response.write(chunk)
            await response.write_eof()
            captured.done = time.monotonic()
            return response
