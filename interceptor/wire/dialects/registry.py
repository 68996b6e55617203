"""The dialects the server speaks, in one tuple. The turn routes (aiohttp's and the fast lane's), the shape an
error takes on each path, the relay shapes (`interceptor/relay/shapes.py`) and the tests that run every dialect all
read `DIALECTS`: a new dialect is its module and one entry here."""

from __future__ import annotations

from aiohttp import web

from interceptor.errors import ApiError
from interceptor.wire.dialects import Dialect
from interceptor.wire.dialects.chat import CHAT
from interceptor.wire.dialects.messages import MESSAGES
from interceptor.wire.dialects.responses import RESPONSES

__all__ = ["DEFAULT_DIALECT", "DIALECTS", "dialect_for_path", "error_for"]

DIALECTS: tuple[Dialect, ...] = (CHAT, MESSAGES, RESPONSES)
DEFAULT_DIALECT = CHAT  # the shape of errors on paths no dialect owns (the admin API, /health, a mistyped route)


def dialect_for_path(path: str) -> Dialect:
    """The dialect of a request path, whose shape its errors are answered in: the one whose endpoint (or an endpoint
    under it, like Messages' `count_tokens`) the path names; chat's otherwise."""
    for dialect in DIALECTS:
        if f"/v1/{dialect.path}" in path:
            return dialect
    return DEFAULT_DIALECT


def error_for(request: web.Request, error: ApiError) -> tuple[int, dict]:
    return dialect_for_path(request.path).error(error)
