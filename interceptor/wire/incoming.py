"""A request body read into its dialect's `ChatRequest`, through the rollout's `BodyCache` (only what follows the
history it shares with a recent body is parsed and normalised)."""

from __future__ import annotations

import orjson

from interceptor.errors import BadRequest
from interceptor.wire.body_cache import BodyCache, ParsedBody
from interceptor.wire.dialects import Dialect
from interceptor.wire.protocol import ChatRequest

__all__ = ["read_request", "unseen_part"]


def read_request(dialect: Dialect, cache: BodyCache, raw: bytes, relayed: bool) -> tuple[ParsedBody, ChatRequest]:
    """The body read through the rollout's cache (only what follows the history it shares with a recent body is
    parsed), and the dialect's request. black_box (relayed): the upstream honours the options; only what the trace
    reads (messages, tools, stream) is checked."""
    try:
        parsed = cache.read(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(parsed.body, dict):
        raise BadRequest("the request body must be a JSON object")
    previous = parsed.previous
    continues = (previous, parsed.reused) if parsed.same_rest and parsed.reused and isinstance(previous, ChatRequest) else None
    return parsed, dialect.parse(parsed.body, relayed=relayed, continues=continues)


def unseen_part(parsed: ParsedBody, history_key: str) -> object:
    """What of the body no earlier body of the rollout held: all of it, or its new history elements (and its other
    fields when they changed)."""
    if not parsed.reused:
        return parsed.body
    new = parsed.body[history_key][parsed.reused:]
    return new if parsed.same_rest else {**parsed.body, history_key: new}
