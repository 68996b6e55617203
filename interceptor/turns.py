"""A rollout's turns (`POST /rollout/{id}/v1/{chat/completions,messages,responses}`), over aiohttp and the fast lane.

    turns = Turns(server)
    app.router.add_post(".../chat/completions", turns.aiohttp_handler(CHAT))    # every turn, streamed or not
    lane_routes.add("POST", ".../chat/completions", turns.lane_handler(CHAT))   # the gate's turns

A turn is read through the rollout's body cache (only what follows the history it shares with a recent body is
parsed), then relayed (black_box) or run by the gate (`gate.run_turn`) and answered in one piece or as events. The
fast lane (`lane.py`) answers the gate's turns that are not streamed; it declines a streamed one before anything
is kept, and aiohttp's path then reads it as if for the first time.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import orjson
from aiohttp import web

from interceptor.errors import ApiError, error_answer, json_response
from interceptor.gate.turn import HEAVY_REQUEST_BYTES, PARSE_OFF_LOOP_BYTES, run_turn
from interceptor.relay.shapes import relay_shape_for
from interceptor.relay.turn import relay_turn
from interceptor.rollouts import Rollout, TurnResult
from interceptor.transport.lane import LaneReply, LaneRequest, LaneStream
from interceptor.wire.body_cache import BodyCache, ParsedBody
from interceptor.wire.dialects import Dialect
from interceptor.wire.dialects.registry import DIALECTS, error_for
from interceptor.wire.incoming import read_request, unseen_part
from interceptor.wire.protocol import ChatRequest, ensure_serialisable
from interceptor.wire.request_body import read_body
from interceptor.wire.streaming import SSE_HEADERS, EventWriter, open_aiohttp_stream, stream_turn

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer

__all__ = ["Turns", "lane_error"]


class Turns:
    def __init__(self, server: InterceptionServer) -> None:
        self._server = server

    def aiohttp_handler(self, dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return functools.partial(self._turn, dialect=dialect)

    def lane_handler(self, dialect: Dialect) -> Callable[[LaneRequest], Awaitable[LaneReply | LaneStream]]:
        return functools.partial(self._lane_turn, dialect=dialect)

    # ------------------------------------------------------------------------------------------- aiohttp

    async def _turn(self, request: web.Request, *, dialect: Dialect) -> web.StreamResponse:
        server = self._server
        rollout = server.authorize(request, dialect=dialect)
        with self._in_flight(rollout, dialect):
            raw = await read_body(request, server.body_limits)
            if server.policy is None:
                return await self._relay(request, rollout, dialect, raw)
            answer = await self._gate(request, rollout, dialect, raw, functools.partial(open_aiohttp_stream, request))
            if not isinstance(answer, _Reply):
                return answer  # the stream, finished
            response = json_response(answer.body)
            await response.prepare(request)
            await response.write_eof()
            answer.delivered()
            return response

    async def _relay(self, request: web.Request, rollout: Rollout, dialect: Dialect, raw: bytes) -> web.StreamResponse:
        cache, parsed, chat = await self._parse(rollout, dialect, raw)
        self._keep(rollout, cache, parsed, chat)
        ensure_serialisable(unseen_part(parsed, dialect.history_key), "body")  # it is recorded: it must serialise
        return await relay_turn(request, self._server.replicas, rollout, raw, parsed.body, chat,
                                shape=relay_shape_for(dialect.name), journal=self._server.journal)

    # ----------------------------------------------------------------------------------------- fast lane

    async def _lane_turn(self, request: LaneRequest, *, dialect: Dialect) -> LaneReply | LaneStream:
        """A gate turn, answered as `_turn` answers it: in one piece, or as events."""
        rollout = self._server.authorize(request, dialect=dialect)
        with self._in_flight(rollout, dialect):
            raw = await read_body(request, self._server.body_limits)
            answer = await self._gate(request, rollout, dialect, raw,
                                      functools.partial(request.open_stream, 200, SSE_HEADERS))
        if not isinstance(answer, _Reply):
            return answer
        return LaneReply(200, orjson.dumps(answer.body), on_sent=answer.delivered)

    # ------------------------------------------------------------------------------------------ the turn

    async def _gate(self, request: web.Request | LaneRequest, rollout: Rollout, dialect: Dialect, raw: bytes,
                    open_stream: Callable[[], Awaitable[EventWriter]]) -> _Reply | EventWriter:
        """The gate's answer to a turn: its reply (to be sent in one piece), or its events, sent through
        `open_stream` (the writer is returned finished)."""
        server = self._server
        cache, parsed, chat = await self._parse(rollout, dialect, raw)
        self._keep(rollout, cache, parsed, chat)
        turn, delivered = self._run(rollout, parsed, chat, raw=raw, sdk_retry=_sdk_retry(request))
        model = server.config.served_model_name
        if chat.stream:
            return await stream_turn(open_stream, turn, dialect.stream(chat, model=model),
                                     hold_s=server.config.stream_hold_s, keepalive_s=server.config.keepalive_s,
                                     on_delivered=delivered)
        return _Reply(dialect.reply(await turn, chat, model=model), delivered)

    @contextmanager
    def _in_flight(self, rollout: Rollout, dialect: Dialect) -> Iterator[None]:
        rollout.in_flight += 1
        try:
            yield
            self._server.metrics.turns.labels(self._server.config.mode, dialect.name).inc()
        except (ApiError, web.HTTPException, ConnectionError):
            raise  # the client's fault or the upstream's (counted where raised), or the client went away
        except Exception as exc:  # a defect (a 500): no reward may follow from a turn the server got wrong
            rollout.server_failed(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            rollout.in_flight -= 1
            rollout.last_activity = time.monotonic()

    async def _parse(self, rollout: Rollout, dialect: Dialect, raw: bytes) -> tuple[BodyCache, ParsedBody, ChatRequest]:
        """The body read through the rollout's cache, which keeps it once the dialect accepted it (`_keep`)."""
        cache = rollout.body_cache(dialect.name, dialect.history_key)
        relayed = self._server.policy is None
        if len(raw) > PARSE_OFF_LOOP_BYTES and not cache.extends_recent(raw):
            parsed, chat = await asyncio.to_thread(read_request, dialect, cache, raw, relayed)
        else:
            parsed, chat = read_request(dialect, cache, raw, relayed)
        return cache, parsed, chat

    @staticmethod
    def _keep(rollout: Rollout, cache: BodyCache, parsed: ParsedBody, chat: ChatRequest) -> None:
        cache.keep(parsed, chat)
        if chat.ignored and not rollout.ignored_noted.issuperset(chat.ignored):
            rollout.ignored_noted.update(chat.ignored)
            rollout.note("ignored_request_fields", fields=list(chat.ignored))

    def _run(self, rollout: Rollout, parsed: ParsedBody, chat: ChatRequest, *, raw: bytes,
             sdk_retry: bool) -> tuple[Awaitable[TurnResult], Callable[[], None]]:
        """The gate's turn, and what marks its answer delivered (a retry of a delivered turn is a new turn)."""
        attempts_key = parsed.fingerprint  # SDK retries resend the same bytes
        turn = run_turn(self._server.policy, rollout, chat, fingerprint=attempts_key, sdk_retry=sdk_retry,
                        heavy=len(raw) > HEAVY_REQUEST_BYTES)  # a heavy turn's work goes to a worker thread

        def delivered() -> None:
            attempts = rollout.attempts.get(attempts_key)
            if attempts is not None:
                attempts.delivered = True

        return turn, delivered


class _Reply(NamedTuple):
    body: dict
    delivered: Callable[[], None]  # marks the turn's answer delivered, once it is handed to the socket


def lane_error(request: LaneRequest, error: Exception) -> LaneReply:
    """What the fast lane answers for an error: the error middleware's status and body (`errors.error_answer`)."""
    status, body, headers = error_answer(error_for, request, error)
    return LaneReply(status, orjson.dumps(body), headers=tuple((headers or {}).items()))


def _sdk_retry(request: web.Request | LaneRequest) -> bool:
    """The OpenAI and Anthropic SDKs number their retries in `X-Stainless-Retry-Count` (0 on the first try)."""
    count = request.headers.get("X-Stainless-Retry-Count", "0")
    return count.isdigit() and int(count) > 0
