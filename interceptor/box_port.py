"""The box port: the rollout routes alone, served where a box that is not on this host's loopback can reach them.

A box in Interceptor's own sandboxes reaches the server through a bridge onto its loopback; a box that another
runner makes (Harbor's Docker environment, a remote sandbox service) is on a network of its own and must be given a
real address. That address serves only what a rollout's agent uses, each behind that rollout's secret:

    POST /rollout/{id}/v1/<dialect>              a turn (chat completions, responses, messages)
    GET  /rollout/{id}/v1/models, POST .../messages/count_tokens, POST .../tools/{name}

Never the admin API (/rollouts), /metrics, /health or a mounted page: those stay on the server's own port, which
keeps its loopback default. A box that guesses another rollout's id still needs that rollout's secret (401).

    url = await server.box_port.expose("172.18.0.1")     # a container network's gateway: http://172.18.0.1:PORT
    await server.box_port.withdraw("172.18.0.1")        # when the last box on that network is gone

One port number for every address (the first `expose` picks it, or `ServerConfig.box_port`), so a URL is the address
and that port. Each address is exposed once and counted: `withdraw` stops listening when the last user is done.
`ServerConfig.box_listen` exposes an address for the server's whole life (a remote backend's boxes reach it through
the network or a tunnel), and `ServerConfig.box_url` is what such boxes are told when it differs (a public name).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from interceptor.config import parse_host_port
from interceptor.errors import ConfigError, errors_middleware_for
from interceptor.rollout_routes import add_rollout_routes
from interceptor.wire.dialects.registry import DIALECTS, error_for

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer
    from interceptor.turns import Turns

__all__ = ["BoxPort"]

log = logging.getLogger("interceptor.box_port")


class BoxPort:
    def __init__(self, server: InterceptionServer, turns: Turns) -> None:
        app = web.Application(middlewares=[errors_middleware_for(error_for)],
                              client_max_size=server.config.max_body_bytes)  # fmt: skip
        for dialect in DIALECTS:
            app.router.add_post(f"/rollout/{{rid}}/v1/{dialect.path}", turns.aiohttp_handler(dialect))
        add_rollout_routes(app, server)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=False,
                                     shutdown_timeout=server.config.shutdown_grace_s, auto_decompress=False)  # fmt: skip
        config = server.config
        self._listen = parse_host_port(config.box_listen, what="box_listen") if config.box_listen else None
        self._public_url = config.box_url.rstrip("/") if config.box_url else None
        self._port = self._listen[1] if self._listen else 0
        self._sites: dict[str, tuple[web.TCPSite, int]] = {}  # address -> (its site, how many users)
        self._lock = asyncio.Lock()
        self._set_up = False

    async def start(self) -> None:
        """Listen on `box_listen` for the server's life, if it is set."""
        if self._listen is not None:
            await self.expose(self._listen[0])

    @property
    def url(self) -> str | None:
        """What a remote box is told: `box_url`, else `box_listen`'s address; None without `box_listen`."""
        if self._listen is None:
            return None
        return self._public_url or url_for(self._listen[0], self._port)

    @property
    def port(self) -> int | None:
        """The port every exposed address listens on (None before the first `expose` with port 0)."""
        return self._port or None

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._sites)

    async def expose(self, host: str) -> str:
        """Listen on `host` (once; counted) and return the base URL a box there uses: `http://host:port`."""
        async with self._lock:
            if not self._set_up:
                await self._runner.setup()
                self._set_up = True
            if host in self._sites:
                site, users = self._sites[host]
                self._sites[host] = (site, users + 1)
            else:
                site = web.TCPSite(self._runner, host, self._port)
                try:
                    await site.start()
                except OSError as exc:
                    raise ConfigError(f"the box port cannot listen on {host}:{self._port}: {exc}") from exc
                if not self._port:  # the first address picked it: every later one listens on the same number
                    self._port = self._runner.addresses[0][1]
                self._sites[host] = (site, 1)
                log.info("box port: the rollout routes on %s:%d", host, self._port)
        return url_for(host, self._port)

    async def withdraw(self, host: str) -> None:
        """One user of `host` is done; the last one stops its listening (in-flight requests finish first)."""
        async with self._lock:
            if host not in self._sites:
                return
            site, users = self._sites[host]
            if users > 1:
                self._sites[host] = (site, users - 1)
                return
            del self._sites[host]
        await site.stop()

    async def aclose(self) -> None:
        async with self._lock:
            self._sites.clear()
            if self._set_up:
                await self._runner.cleanup()
                self._set_up = False


def url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

