"""Dialects: the wire protocols an agent may speak to its rollout endpoint, one module each.

    POST /rollout/<id>/v1/chat/completions    OpenAI chat completions (`chat`)
    POST /rollout/<id>/v1/messages            Anthropic Messages (`messages`), and /v1/messages/count_tokens
    POST /rollout/<id>/v1/responses           OpenAI Responses (`responses`), as Codex CLI speaks it

A dialect turns its request into the one `ChatRequest` the gate plans, generates and records (OpenAI-style
messages and function tools, which the chat template renders), and turns the `TurnResult` back into its own reply,
streamed or not, with its own error shape and credential header. The trajectory, forks, retry detection, journal,
recorder and fault handling are one code path for every dialect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from interceptor.errors import ApiError
from interceptor.wire.protocol import ChatRequest

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from interceptor.rollouts import TurnResult

__all__ = ["Dialect", "StreamShape", "dialect_for_path", "error_for"]


class StreamShape(Protocol):
    """One streamed answer in a dialect's events. The gate's answer exists whole once generated; if it is not
    ready within the server's hold, `opening` goes out first, then `keepalive` until it is."""

    keepalive: bytes

    def opening(self) -> bytes: ...

    def events(self, result: TurnResult, *, opened: bool) -> bytes: ...  # the rest (all of it if not opened)

    def failure(self, error: ApiError) -> bytes: ...  # a failure after the headers went out


class Dialect(Protocol):
    name: str
    path: str  # the endpoint under /rollout/<id>/v1/
    history_key: str  # the body's field that holds the conversation (what `body_cache.py` reads incrementally)

    def authorization(self, request: web.Request) -> str | None:
        """The credential as `Bearer <secret>`, from whichever header this dialect's clients send."""
        ...

    def parse(self, body: dict, *, relayed: bool = False, continues: tuple[ChatRequest, int] | None = None) -> ChatRequest:
        """The request as the gate's ChatRequest; `relayed` (black_box): only what the trace reads is checked, the
        upstream honours or refuses the rest. `continues` (the request of an earlier body, and how many leading
        history elements this body shares with it, every other field being the same) lets a dialect read only the
        new elements; a dialect may ignore it."""
        ...

    def reply(self, result: TurnResult, chat: ChatRequest, *, model: str) -> dict: ...

    def stream(self, chat: ChatRequest, *, model: str) -> StreamShape: ...

    def error(self, error: ApiError) -> tuple[int, dict]:
        """Status and body of an error in this dialect's shape."""
        ...


def dialect_for_path(path: str) -> Dialect:
    """The dialect of a request path (its errors are answered in that dialect's shape); chat by default."""
    from interceptor.wire.dialects.chat import CHAT  # noqa: PLC0415  (the registry imports the dialects, which import this module)
    from interceptor.wire.dialects.messages import MESSAGES  # noqa: PLC0415
    from interceptor.wire.dialects.responses import RESPONSES  # noqa: PLC0415

    if "/v1/messages" in path:
        return MESSAGES
    if "/v1/responses" in path:
        return RESPONSES
    return CHAT


def error_for(request: web.Request, error: ApiError) -> tuple[int, dict]:
    return dialect_for_path(request.path).error(error)
