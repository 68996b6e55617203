"""A request's body as every handler reads it: its `Content-Encoding` undone here, once, for aiohttp and the fast
lane alike.

    raw = await read_body(request, server.body_limits)   # web.Request or LaneRequest; BodyLimits

The body limits are the server's (`BodyLimits`): its largest body, and for a body aiohttp reads (the lane has read
its own whole before its handler runs) the budget of bodies in flight (`body_budget.py`) and a time to arrive in.

aiohttp's own decoding is off (`auto_decompress=False`, server.py), because it failed outside the app: a gzip or
deflate body that did not inflate raised inside its parser (logged as an unhandled error, the keep-alive connection
dropped), a coding it had no decoder for (brotli without the Brotli package) was a plain-text 400 before the app saw
the request, and a coding it did not know passed through as if it were identity. Here each is an error in the
client's own shape: 415 for a coding not undone here (brotli, zstd, any other name), 400 for a body that does not
inflate, 413 for one that inflates past the body limit. The body itself arrived whole either way (its length is
HTTP's framing, not the coding's), so the connection goes on to the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from interceptor.errors import BadRequest, PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from interceptor.wire.body_budget import BodyBudget

if TYPE_CHECKING:
    from interceptor.transport.lane import LaneRequest

__all__ = ["BodyLimits", "decoded", "read_body"]

# zlib's window bits for each coding undone here: gzip's header and trailer (31), zlib's for deflate (15, which is
# what HTTP's "deflate" means; raw deflate, which some clients send under that name, is tried when it fails)
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
_RAW_DEFLATE = -15


@dataclass(frozen=True, kw_only=True)
class BodyLimits:
    max_bytes: int  # once inflated
    budget: BodyBudget | None = None  # what bodies still arriving may hold, all connections together
    timeout_s: float | None = None  # for a body aiohttp reads to arrive whole


async def read_body(request: web.Request | LaneRequest, limits: BodyLimits) -> bytes:
    """The body with its content codings undone, at most `limits.max_bytes` bytes once inflated."""
    raw = await _received(request, limits)
    coding = request.headers.get("Content-Encoding")
    return raw if coding is None else decoded(raw, coding, limit=limits.max_bytes)


async def _received(request: web.Request | LaneRequest, limits: BodyLimits) -> bytes:
    if (not isinstance(request, web.Request) or not request.can_read_body or request.content.is_eof()
            or limits.budget is None):
        return await request.read()  # the lane's, or one already here whole (nothing in flight), or none
    length = request.content_length
    holding = limits.budget.holding(limits.max_bytes if length is None else length)  # chunked: up to the limit
    waiting = asyncio.timeout(limits.timeout_s) if limits.timeout_s is not None else contextlib.nullcontext()
    try:
        with holding:
            async with waiting:
                return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the request's body did not arrive whole within {limits.timeout_s:g} s") from None


def decoded(raw: bytes, coding: str, *, limit: int) -> bytes:
    """`raw` with the codings a Content-Encoding value lists undone (the last one listed was applied last)."""
    for name in reversed([c.strip().lower() for c in coding.split(",")]):
        if name in ("", "identity"):
            continue
        wbits = _WBITS.get(name)
        if wbits is None:
            raise UnsupportedMediaType(
                f"the request body's Content-Encoding {name[:40]!r} is not supported; send it as gzip, as deflate "
                "or uncompressed"
            )
        raw = _inflated(raw, name, wbits, limit=limit)
    return raw


def _inflated(raw: bytes, name: str, wbits: int, *, limit: int) -> bytes:
    pieces: list[bytes] = []
    size = 0
    rest = raw
    while True:  # gzip may hold several members, one after another
        inflater = zlib.decompressobj(wbits)
        try:
            piece = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            if wbits == 15 and not pieces:
                return _inflated(raw, name, _RAW_DEFLATE, limit=limit)
            raise BadRequest(f"the request body is not valid {name} data ({exc})") from exc
        size += len(piece)
        if size > limit:
            raise PayloadTooLarge(f"request body too large: it inflates past {limit} bytes")
        if not inflater.eof:
            raise BadRequest(f"the request body's {name} data is cut short")
        pieces.append(piece)
        rest = inflater.unused_data
        if not rest:
            return b"".join(pieces)
        if wbits != 31:
            raise BadRequest(f"the request body has bytes after its {name} data")
