"""The `RelayShape`s of Anthropic Messages and OpenAI Responses for black_box relays (chat's is in `turn.py`).

Each reads the upstream's answer back, JSON or stream, into the internal OpenAI-style assistant message the trace
records (the same form the dialects' `parse` gives the request's messages): Messages' `text` blocks are its
content, `thinking` its `reasoning_content`, `tool_use` its tool calls (`input` as JSON arguments); Responses'
`message` items are its content, `reasoning` items (text, else summary) its `reasoning_content`, `function_call`
items its tool calls (id `call_id`). Blocks and items the interceptor has no form for (server tool results,
encrypted reasoning, ...) reach the agent as they came and are left out of the trace. Finish reasons become chat's
(`stop`, `tool_calls`, `length`); a reason chat has no name for is kept as it came.

Credentials: Messages sends the server's key as `x-api-key`, with the agent's `anthropic-version` (or
`2023-06-01`) and `anthropic-beta`; Responses sends it as a Bearer token. A stream broken off ends with Messages'
`error` event or Responses' `response.failed`.
"""

from __future__ import annotations

import json
from dataclasses import replace

import orjson
from aiohttp import web

from interceptor.errors import ApiError
from interceptor.relay.turn import CHAT_RELAY, EventCollector, Rebuilt, RelayShape, error_message, token_count
from interceptor.wire.dialects.chat import CHAT
from interceptor.wire.dialects.messages import MESSAGES
from interceptor.wire.dialects.responses import RESPONSES

__all__ = ["MESSAGES_RELAY", "RELAY_SHAPES", "RESPONSES_RELAY", "relay_shape_for"]

ANTHROPIC_VERSION = "2023-06-01"  # what the upstream gets when the agent names no version
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def relay_shape_for(dialect_name: str) -> RelayShape:
    """The relay shape of a dialect in `interceptor.wire.dialects.registry.DIALECTS` (a test holds every one to
    having one here)."""
    return RELAY_SHAPES[dialect_name]


def _sse(event: str, data: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _arguments(value: object) -> str:
    """Tool call arguments as the dialects' `parse` writes them: JSON, non-ASCII kept."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return value  # not JSON: recorded as the upstream sent it
    return json.dumps(value, ensure_ascii=False)


def _assistant(texts: list[str], reasoning: list[str], calls: list[dict], *, text_joiner: str) -> dict:
    message: dict = {"role": "assistant", "content": text_joiner.join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _call(call_id: str, name: str, arguments: object) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


# ----------------------------------------------------------------------------------------------- Messages


def _messages_usage(usage: object) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    prompt = sum(token_count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
                                                     "cache_read_input_tokens"))  # fmt: skip
    return prompt, token_count(usage.get("output_tokens"))


def _messages_assistant(blocks: list[dict]) -> dict:
    texts, reasoning, calls = [], [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_call(str(block.get("id", "")), str(block.get("name", "")), block.get("input", {})))
    return _assistant(texts, reasoning, calls, text_joiner="")


class _MessagesRelay:
    path = "/v1/messages"
    key_header = "x-api-key"

    def headers(self, request: web.Request) -> dict[str, str]:
        headers = {"anthropic-version": request.headers.get("anthropic-version", ANTHROPIC_VERSION)}
        if "anthropic-beta" in request.headers:
            headers["anthropic-beta"] = request.headers["anthropic-beta"]
        return headers

    def read_reply(self, body: object) -> Rebuilt:
        message = _messages_assistant([b for b in body["content"] if isinstance(b, dict)])  # type: ignore[index]
        stop = body.get("stop_reason")  # type: ignore[union-attr]
        stop = _STOP_REASONS.get(stop, stop) if isinstance(stop, str) else None
        return Rebuilt(message, stop, *_messages_usage(body.get("usage")))  # type: ignore[union-attr]

    def collector(self) -> _MessagesCollector:
        return _MessagesCollector()


class _MessagesCollector(EventCollector):
    """Rebuilds the assistant message from Messages events as they pass through (for the trace only)."""

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, dict] = {}
        self._json: dict[int, list[str]] = {}  # a tool_use block's input_json_delta parts
        self._stop: str | None = None
        self._prompt = self._completion = 0
        self._error: str | None = None

    def _take(self, event: dict) -> None:
        kind, index = event.get("type"), event.get("index")
        if type(index) is not int:  # a key of `_blocks`, looked up and sorted: nothing else names a block
            index = None
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._prompt, self._completion = _messages_usage(event["message"].get("usage"))
        elif kind == "content_block_start" and index is not None and isinstance(event.get("content_block"), dict):
            self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and index in self._blocks and isinstance(event.get("delta"), dict):
            block, delta = self._blocks[index], event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif delta.get("type") == "input_json_delta":
                self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "message_delta":
            stop = event["delta"].get("stop_reason") if isinstance(event.get("delta"), dict) else None
            self._stop = stop if isinstance(stop, str) and stop else self._stop  # looked up in _STOP_REASONS
            prompt, completion = _messages_usage(event.get("usage"))
            self._prompt, self._completion = prompt or self._prompt, completion or self._completion
        elif kind == "error":
            self._error = error_message(event.get("error"), event)

    def rebuilt(self) -> Rebuilt:
        blocks = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if index in self._json:
                block = {**block, "input": "".join(self._json[index])}
            blocks.append(block)
        stop = _STOP_REASONS.get(self._stop, self._stop)
        return Rebuilt(_messages_assistant(blocks), stop, self._prompt, self._completion, error=self._error)

    def failure(self, error: ApiError) -> bytes:
        return _sse("error", MESSAGES.error(error)[1])


# ---------------------------------------------------------------------------------------------- Responses


def _responses_reply(response: dict) -> Rebuilt:
    texts, reasoning, calls = [], [], []
    for item in response.get("output") or ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            texts += [p["text"] for p in item.get("content") or () if isinstance(p, dict)
                      and p.get("type") == "output_text" and isinstance(p.get("text"), str)]  # fmt: skip
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or ()
            reasoning += [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        elif kind == "function_call":
            calls.append(_call(str(item.get("call_id", "")), str(item.get("name", "")), item.get("arguments", "")))
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        finish = "length" if reason == "max_output_tokens" else reason or status
    else:
        finish = "tool_calls" if calls else "stop" if status == "completed" else status
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    prompt, completion = token_count(usage.get("input_tokens")), token_count(usage.get("output_tokens"))
    return Rebuilt(_assistant(texts, reasoning, calls, text_joiner="\n"), finish, prompt, completion)


class _ResponsesRelay:
    path = "/v1/responses"
    key_header = None  # a Bearer token

    def headers(self, request: web.Request) -> dict[str, str]:
        return {}

    def read_reply(self, body: object) -> Rebuilt:
        if not isinstance(body, dict) or not isinstance(body.get("output"), list):
            raise TypeError("not a response object")
        return _responses_reply(body)

    def collector(self) -> _ResponsesCollector:
        return _ResponsesCollector()


class _ResponsesCollector(EventCollector):
    """Keeps the output items done so far and the last `response` object an event carried (the terminal event's is
    the whole answer); a stream broken off is answered with `response.failed` numbered after the last event."""

    def __init__(self) -> None:
        super().__init__()
        self._response: dict = {"id": "resp_relayed", "object": "response", "output": []}
        self._done_items: dict[int, dict] = {}
        self._terminal = False
        self._sequence = -1
        self._error: str | None = None

    def _take(self, event: dict) -> None:
        if isinstance(event.get("sequence_number"), int):
            self._sequence = max(self._sequence, event["sequence_number"])
        kind = event.get("type")
        if isinstance(event.get("response"), dict):
            self._response = event["response"]
            self._terminal = kind in ("response.completed", "response.incomplete", "response.failed")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            index = event.get("output_index")
            self._done_items[index if type(index) is int else len(self._done_items)] = event["item"]
        if kind == "response.failed":
            self._error = error_message(self._response.get("error"), "the response failed")
        elif kind == "error":
            self._error = str(event.get("message") or event)[:2000]

    def rebuilt(self) -> Rebuilt:
        response = self._response
        if not (self._terminal and response.get("output")):
            response = {**response, "output": [self._done_items[i] for i in sorted(self._done_items)]}
        return replace(_responses_reply(response), error=self._error)

    def failure(self, error: ApiError) -> bytes:
        failed = {**self._response, "status": "failed", "error": {"code": error.code or error.type,
                                                                  "message": error.message}}  # fmt: skip
        self._sequence += 1
        return _sse("response.failed", {"type": "response.failed", "sequence_number": self._sequence,
                                        "response": failed})  # fmt: skip


MESSAGES_RELAY = _MessagesRelay()
RESPONSES_RELAY = _ResponsesRelay()
RELAY_SHAPES: dict[str, RelayShape] = {CHAT.name: CHAT_RELAY, MESSAGES.name: MESSAGES_RELAY,
                                       RESPONSES.name: RESPONSES_RELAY}  # by dialect name: one entry per dialect
