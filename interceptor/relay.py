"""`black_box` mode: relay a chat request to an upstream OpenAI-compatible API and record the message trace.

The agent's body goes upstream as it came, except `model` (the configured upstream model, when set) and the
credentials (the server's key, never the agent's). A stream is passed through chunk by chunk as it arrives; the
assistant message is rebuilt from the deltas on the side, for the trace. No token data exists in this mode.
Any answer that is not a success (a 404 for an unknown model as much as a 503) is an upstream failure of the
rollout, and a stream the upstream breaks off ends with an `error` event.
"""

from __future__ import annotations

import aiohttp
import orjson
from aiohttp import web

from .errors import UpstreamError, UpstreamUnavailable, error_body
from .journal import Journal
from .protocol import ChatRequest
from .replies import SSE_DONE, encode_sse
from .rollouts import Rollout
from .streaming import SSE_HEADERS
from .trajectory import message_key
from .upstream import UpstreamClient

__all__ = ["relay_chat"]


async def relay_chat(
    request: web.Request,
    upstream: UpstreamClient,
    rollout: Rollout,
    body: dict,
    chat: ChatRequest,
    *,
    journal: Journal | None,
) -> web.StreamResponse:
    if upstream.config.model:
        body = {**body, "model": upstream.config.model}
    keys = [message_key(m) for m in chat.messages]
    known = _common_prefix(rollout.last_messages_keys, keys)
    rollout.last_messages_keys = keys
    entry: dict = rollout.scrub({"new_messages": chat.messages[known:], "known_messages": known})
    rollout.trace.append(entry)
    try:
        return await _relay(request, upstream, rollout, body, chat, entry)
    except UpstreamError as exc:
        rollout.upstream_failed(exc.message)
        rollout.note("upstream_error", status=exc.status, message=exc.message)
        raise
    finally:
        if journal is not None:
            journal.trace(rollout.id, trace=entry, usage=(rollout.prompt_tokens, rollout.completion_tokens))


async def _relay(
    request: web.Request, upstream: UpstreamClient, rollout: Rollout, body: dict, chat: ChatRequest, entry: dict
) -> web.StreamResponse:
    async with upstream.relay("/v1/chat/completions", orjson.dumps(body)) as resp:
        entry["status"] = resp.status
        if resp.status < 400:
            rollout.trailing_upstream_failures = 0
        else:
            rollout.upstream_failed(f"the upstream answered {resp.status}")
            rollout.note("upstream_error", status=resp.status)
        if not chat.stream or resp.status >= 400 or not resp.content_type.startswith("text/event-stream"):
            raw = await resp.read()
            _record_completion(rollout, entry, raw)
            return web.Response(body=raw, status=resp.status, content_type=resp.content_type or "application/json")
        response = web.StreamResponse(status=resp.status, headers=SSE_HEADERS)
        await response.prepare(request)
        collected = _StreamCollector()
        try:
            async for chunk in resp.content.iter_any():
                await response.write(chunk)
                collected.feed(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the upstream broke off after the headers
            error = UpstreamUnavailable(f"the upstream stream broke off: {type(exc).__name__}")
            rollout.upstream_failed(error.message)
            rollout.note("upstream_error", status=error.status, message=error.message)
            entry["stream_error"] = error.message
            await response.write(encode_sse(error_body(error)) + SSE_DONE)
        await response.write_eof()
        entry["response"] = collected.message()
        entry["finish_reason"] = collected.finish_reason
        _add_usage(rollout, collected.usage)
        return response


def _common_prefix(a: list[tuple], b: list[tuple]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _record_completion(rollout: Rollout, entry: dict, raw: bytes) -> None:
    try:
        body = orjson.loads(raw)
        choice = body["choices"][0]
        entry["response"] = choice.get("message")
        entry["finish_reason"] = choice.get("finish_reason")
        _add_usage(rollout, body.get("usage"))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        entry["response_error"] = raw[:2000].decode(errors="replace")


def _add_usage(rollout: Rollout, usage: object) -> None:
    if isinstance(usage, dict):
        rollout.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        rollout.completion_tokens += int(usage.get("completion_tokens") or 0)


class _StreamCollector:
    """Rebuilds the assistant message from SSE chunks as they pass through (for the trace only)."""

    def __init__(self) -> None:
        self._buffer = b""
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *events, self._buffer = self._buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    self._take(line[5:].strip())

    def _take(self, payload: bytes) -> None:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(
                    call.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict:
        message: dict = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message
