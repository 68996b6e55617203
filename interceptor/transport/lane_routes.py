"""Which handler the fast lane (`lane.py`) answers a request with: routes as aiohttp spells them, and aiohttp
handlers served as they are.

    routes = LaneRoutes()
    routes.add("POST", "/rollout/{rid}/v1/chat/completions", turns.lane_handler(CHAT))
    routes.add("GET", "/rollouts/{rid}", from_aiohttp(show_rollout))
    lane = await Lane.start(..., take=routes.take)
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from interceptor.transport.lane import Handler, LaneReply, LaneRequest

__all__ = ["LaneRoutes", "from_aiohttp"]


def from_aiohttp(handler: Callable[[LaneRequest], Awaitable[object]]) -> Handler:
    """An aiohttp handler served by the lane: one that reads only the request's headers, path parameters and body,
    and answers an `aiohttp.web.Response` whose body is bytes (the server's JSON routes)."""

    async def serve(request: LaneRequest) -> LaneReply:
        response = await handler(request)
        if not isinstance(response.body, bytes):
            raise TypeError(f"{request.method} {request.path}: the lane sends bytes bodies, not {type(response.body)}")
        headers = response.headers
        extra = tuple((k, v) for k, v in headers.items() if k.lower() not in ("content-type", "content-length"))
        return LaneReply(response.status, response.body, headers.get("Content-Type", "application/octet-stream"),
                         extra)

    return serve


class LaneRoutes:
    """The routes the lane serves, as aiohttp spells them (`/rollouts/{rid}/finish`); its `take` is `Lane`'s.

    A `{name}` matches letters, digits, `-` and `_` only (the server's ids): a path with anything else (an escape,
    a dot) is aiohttp's, which reads it as it always has."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[A-Za-z0-9_-]+)", re.escape(path))
        self._routes.append((method, re.compile(pattern), handler))

    def take(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
        for route_method, pattern, handler in self._routes:
            if route_method == method and (match := pattern.fullmatch(path)) is not None:
                return handler, match.groupdict()
        return None
