"""`black_box` mode: relay a turn to an upstream API in the agent's own dialect and record the message trace.

The agent's body goes upstream as it came, except `model` (the configured upstream model, when set) and the
credentials (the server's key, never the agent's). A stream is passed through chunk by chunk as it arrives; the
assistant message is rebuilt from the events on the side, for the trace, in the one internal OpenAI-style form
(role, content, tool_calls, reasoning_content) whatever the dialect. No token data exists in this mode.
Any answer that is not a success (a 404 for an unknown model as much as a 503), and an error event inside a
stream, is an upstream failure of the rollout; a stream the upstream breaks off ends with the dialect's error event.

What differs per dialect (the upstream path and headers, how a reply and a stream are read back, the error event)
is a `RelayShape`: chat's is here, Messages' and Responses' are in `shapes.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import aiohttp
import orjson
from aiohttp import web

from interceptor.errors import ApiError, UpstreamError, UpstreamUnavailable, error_body
from interceptor.gate.history import message_key
from interceptor.rollouts import Rollout
from interceptor.store.journal import Journal
from interceptor.transport.replicas import ReplicaSet
from interceptor.wire.protocol import ChatRequest
from interceptor.wire.replies import SSE_DONE, encode_sse
from interceptor.wire.streaming import SSE_HEADERS

__all__ = [
    "CHAT_RELAY", "EventCollector", "Rebuilt", "RelayShape", "StreamCollector", "error_message", "json_object",
    "relay_turn", "sse_payloads", "token_count",
]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """The upstream's answer read back for the trace: the assistant message in internal form, and its usage."""

    message: dict | None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # an error event inside a stream: the turn failed upstream


class StreamCollector(Protocol):
    def feed(self, data: bytes) -> None: ...

    def rebuilt(self) -> Rebuilt: ...

    def failure(self, error: ApiError) -> bytes: ...  # the dialect's error event, for a stream broken off


class RelayShape(Protocol):
    path: str  # the upstream path, e.g. /v1/chat/completions
    key_header: str | None  # the header that carries the server's key; None: `Authorization: Bearer`

    def headers(self, request: web.Request) -> dict[str, str]: ...  # the agent's headers the upstream needs

    def read_reply(self, body: object) -> Rebuilt: ...  # a JSON reply; KeyError/TypeError/... if it is not one

    def collector(self) -> StreamCollector: ...


async def relay_turn(
    request: web.Request,
    upstream: ReplicaSet,
    rollout: Rollout,
    raw: bytes,
    body: dict,
    chat: ChatRequest,
    *,
    shape: RelayShape,
    journal: Journal | None,
) -> web.StreamResponse:
    """Relay `raw` (the agent's body, parsed as `body`) as it came, or re-serialised with the configured model."""
    data = orjson.dumps({**body, "model": upstream.config.model}) if upstream.config.model else raw
    known = _known_messages(rollout.last_messages, chat.messages)
    rollout.last_messages = chat.messages
    entry: dict = rollout.scrub({"new_messages": chat.messages[known:], "known_messages": known})
    index = rollout.trace.append(entry)
    try:
        return await _relay(request, upstream, rollout, data, chat, entry, shape)
    except UpstreamError as exc:
        _failed(rollout, exc.status, exc.message)
        raise
    finally:
        if journal is not None:  # the entry is complete: the journal holds it, keep only where it lies
            usage = (rollout.prompt_tokens, rollout.completion_tokens)
            rollout.trace.spill(index, journal.trace(rollout.id, trace=entry, usage=usage))


async def _relay(
    request: web.Request,
    upstream: ReplicaSet,
    rollout: Rollout,
    data: bytes,
    chat: ChatRequest,
    entry: dict,
    shape: RelayShape,
) -> web.StreamResponse:
    async with upstream.relay(
        shape.path, data, rollout_id=rollout.id, extra_headers=shape.headers(request), key_header=shape.key_header
    ) as resp:
        entry["status"] = resp.status
        if resp.status < 400:
            rollout.upstream_succeeded()
        else:
            _failed(rollout, resp.status, f"the upstream answered {resp.status}")
        if not chat.stream or resp.status >= 400 or not resp.content_type.startswith("text/event-stream"):
            raw = await resp.read()
            if resp.status < 400:
                _record(rollout, entry, _read_reply(shape, raw))
            else:
                entry["response_error"] = raw[:2000].decode(errors="replace")
            return web.Response(body=raw, status=resp.status, content_type=resp.content_type or "application/json")
        response = web.StreamResponse(status=resp.status, headers=SSE_HEADERS)
        await response.prepare(request)
        collector, pending = shape.collector(), b""
        try:
            async for chunk in resp.content.iter_any():
                events, pending = _complete_events(pending + chunk)
                if events:
                    await response.write(events)
                    collector.feed(events)
            if pending:  # the stream ended without a blank line after its last event
                await response.write(pending)
                collector.feed(pending + b"\n\n")
        except (aiohttp.ClientError, TimeoutError) as exc:  # the upstream broke off after the headers
            error = UpstreamUnavailable(f"the upstream stream broke off: {type(exc).__name__}")
            _failed(rollout, error.status, error.message)
            entry["stream_error"] = error.message
            await response.write(collector.failure(error))  # the event cut in half is dropped: it would not parse
        await response.write_eof()
        rebuilt = collector.rebuilt()
        if rebuilt.error is not None and "stream_error" not in entry:  # the upstream's own error event
            _failed(rollout, resp.status, rebuilt.error)
            entry["stream_error"] = rebuilt.error
        _record(rollout, entry, rebuilt)
        return response


def _complete_events(data: bytes) -> tuple[bytes, bytes]:
    """`data` split after its last complete SSE event: events pass through whole, as soon as they are complete."""
    end = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, 0)
    return data[:end], data[end:]


def _failed(rollout: Rollout, status: int, message: str) -> None:
    rollout.upstream_failed(message)
    rollout.note("upstream_error", status=status, message=message)


def _read_reply(shape: RelayShape, raw: bytes) -> Rebuilt:
    try:
        return shape.read_reply(orjson.loads(raw))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError, ValueError):
        return Rebuilt(message=None, error=raw[:2000].decode(errors="replace"))


def _record(rollout: Rollout, entry: dict, rebuilt: Rebuilt) -> None:
    if rebuilt.message is None and rebuilt.error is not None and "stream_error" not in entry:
        entry["response_error"] = rebuilt.error  # a success status whose body is not the dialect's reply
        return
    entry["response"] = rebuilt.message
    entry["finish_reason"] = rebuilt.finish_reason
    rollout.prompt_tokens += rebuilt.prompt_tokens
    rollout.completion_tokens += rebuilt.completion_tokens


def _known_messages(last: list[dict], messages: list[dict]) -> int:
    """How many leading `messages` the last call sent too. Resent messages are mostly the very objects of the
    last request (`body_cache.py`), which a list comparison matches in C; otherwise compare message by message."""
    if len(messages) >= len(last) and messages[: len(last)] == last:
        return len(last)
    n = 0
    for x, y in zip(last, messages):
        if x != y and message_key(x) != message_key(y):
            break
        n += 1
    return n


def sse_payloads(buffer: bytes, data: bytes) -> tuple[list[tuple[str, bytes]], bytes]:
    """The complete SSE events in `buffer + data`, as (event name, data payload), and what is left over."""
    *events, rest = (buffer + data).replace(b"\r\n", b"\n").split(b"\n\n")
    out = []
    for event in events:
        name, payload = "", []
        for line in event.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode(errors="replace")
            elif line.startswith(b"data:"):
                payload.append(line[5:].strip())
        if payload:
            out.append((name, b"\n".join(payload)))
    return out, rest


def json_object(payload: bytes) -> dict | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class EventCollector:
    """The part every dialect's collector shares: split what passes into SSE events (across chunk boundaries) and
    hand each JSON object to `_take`, which reads what that dialect's events mean. `[DONE]` and other non-objects
    are skipped."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> None:
        events, self._buffer = sse_payloads(self._buffer, data)
        for _, payload in events:
            event = json_object(payload)
            if event is not None:
                self._take(event)

    def _take(self, event: dict) -> None:
        raise NotImplementedError


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def token_count(value: object) -> int:
    """A usage figure of the upstream's answer as the trace counts it: an integer, else 0 (it is never looked up,
    but a string or a list there must not fail the relay of an answer the agent already has)."""
    return value if type(value) is int and value >= 0 else 0


def error_message(error: object, default: object) -> str:
    """The message of an error object an upstream sent (or `default`), for the trace."""
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or default)[:2000]


def _usage(usage: object) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    return token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))


class _ChatRelay:
    path = "/v1/chat/completions"
    key_header = None

    def headers(self, request: web.Request) -> dict[str, str]:
        return {}

    def read_reply(self, body: object) -> Rebuilt:
        choice = body["choices"][0]  # type: ignore[index]
        prompt, completion = _usage(body.get("usage"))  # type: ignore[union-attr]
        return Rebuilt(choice.get("message"), choice.get("finish_reason"), prompt, completion)

    def collector(self) -> _ChatCollector:
        return _ChatCollector()


class _ChatCollector(EventCollector):
    """Rebuilds the assistant message from chat chunks as they pass through (for the trace only)."""

    def __init__(self) -> None:
        super().__init__()
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: str | None = None

    def _take(self, chunk: dict) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("error"), dict):
            self.error = error_message(chunk["error"], chunk["error"])
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                index = call.get("index", 0) if isinstance(call, dict) else None
                if type(index) is not int:  # a key of `calls`, sorted: a list or a string there is no call's
                    continue
                slot = self.calls.setdefault(
                    index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = _text(call.get("id")) or slot["id"]
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                slot["function"]["name"] += _text(function.get("name"))
                slot["function"]["arguments"] += _text(function.get("arguments"))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def rebuilt(self) -> Rebuilt:
        message: dict = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return Rebuilt(message, self.finish_reason, *_usage(self.usage), error=self.error)

    def failure(self, error: ApiError) -> bytes:
        return encode_sse(error_body(error)) + SSE_DONE


CHAT_RELAY = _ChatRelay()
