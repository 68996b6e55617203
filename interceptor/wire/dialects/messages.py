"""Anthropic Messages as a dialect: `POST /v1/messages` (and `/v1/messages/count_tokens`), as Claude Code and the
`anthropic` SDKs speak it.

Requests become the gate's OpenAI-style conversation:
- `system` (a string or text blocks; `cache_control` is inert; Claude Code's `x-anthropic-billing-header:` block,
  which changes from request to request, is metadata and dropped) is the first message; a `system` message inside
  `messages` (Claude Code 2.1 sends its environment notes so) stays a system message where it is;
- a user message's `tool_result` blocks become `tool` messages (in order, before the user's own text, as the API
  requires them first), its `text` blocks one user message; an assistant message's `text` blocks its content,
  `thinking` its `reasoning_content`, `tool_use` its tool calls (`input` serialised as the arguments);
  `redacted_thinking` (encrypted, never produced by this policy) is dropped, as the chat dialect drops nothing it
  could render; images and documents are refused;
- `tools` with `input_schema` become function tools; a server tool (a `type` such as `web_search_20250305` or
  `bash_20250124`) is refused with a 400 that names it;
- `tool_choice` auto/none honoured (`disable_parallel_tool_use` too); `any` or a named tool refused, as in chat;
- `max_tokens` is an upper bound: the room left in the context bounds it further (Anthropic's meaning), so Claude
  Code's 32000 works against a small context; `stop_sequences` refused (the end-of-turn token ends a turn);
  `temperature`, `top_p`, `top_k` honoured unless the rollout pins them; `thinking`, `context_management`,
  `metadata`, `service_tier` accepted and noted as not acted on (the policy thinks as its template makes it).

Claude Code's compaction request (the history, then its "create a detailed summary of the conversation so far"
prompt) is `request_kind` "compaction": noted as a side request, and the sample it starts says so.

Replies: `content` blocks `thinking` (with an empty signature: nothing is signed here), `text`, `tool_use`;
`stop_reason` end_turn / tool_use / max_tokens; usage in tokens. Streams: `message_start`, per block
`content_block_start` / `_delta` (`thinking_delta`, `text_delta`, `input_json_delta`) / `_stop`, `message_delta`
with the stop reason and usage, `message_stop`; `ping` while a long generation runs; a failure after the headers
is an `error` event. Errors: `{"type": "error", "error": {"type", "message"}}`; a context overflow is
`invalid_request_error` "prompt is too long: N tokens > M maximum" (what Claude Code compacts on); an upstream
that is down is 529 `overloaded_error` (what Anthropic's clients retry). The credential is `x-api-key` or
`Authorization: Bearer`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from interceptor.errors import ApiError, BadRequest, ContextLengthExceeded, UpstreamUnavailable
from interceptor.wire.dialects.messages_input import convert_messages, system_messages, tool_choice
from interceptor.wire.dialects.messages_input import tools as tools_of
from interceptor.wire.protocol import ChatRequest, ensure_serialisable, number_field, positive_int, tools_key
from interceptor.wire.shared_values import share

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from interceptor.rollouts import TurnResult

__all__ = ["MESSAGES", "MessagesDialect"]

_INERT = frozenset({
    "model", "messages", "system", "max_tokens", "stream", "temperature", "top_p", "top_k", "tools", "tool_choice",
    "stop_sequences",
})
# What Claude Code (2.1) puts in the last user message of its compaction request (the history so far, then this).
_COMPACTION_ASK = "Your task is to create a detailed summary of the conversation so far"
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
_INT64 = 2**63


def _sse(event: str, data: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesDialect:
    name = "messages"
    path = "messages"
    history_key = "messages"

    def authorization(self, request: web.Request) -> str | None:
        key = request.headers.get("x-api-key")
        return f"Bearer {key}" if key else request.headers.get("Authorization")

    # ------------------------------------------------------------------------------------------ requests

    def parse(self, body: dict, *, relayed: bool = False, continues: tuple[ChatRequest, int] | None = None) -> ChatRequest:
        """The request, typed. `relayed` (black_box): the upstream honours the options (stop_sequences, any
        tool_choice, server tools, ...), so only what the trace reads (messages, tools, stream) is checked."""
        if continues is not None and len(continues[0].history_ends) >= continues[1]:
            return _continued(*continues, body)
        if relayed:
            return replace(self.parse_for_count(body, relayed=True), stream=_stream(body))
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens < _INT64:
            raise BadRequest("max_tokens: a positive integer is required", param="max_tokens")
        if body.get("stop_sequences"):
            raise BadRequest("stop_sequences are not supported; the model's end-of-turn token ends a turn",
                             param="stop_sequences")  # fmt: skip
        stream = _stream(body)
        choice, parallel = tool_choice(body.get("tool_choice"))
        chat = self.parse_for_count(body)
        return ChatRequest(
            model=chat.model,
            messages=chat.messages,
            tools=chat.tools,
            tools_key=chat.tools_key,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            stream=stream,
            include_usage=True,
            max_tokens=max_tokens,
            temperature=number_field(body, "temperature", low=0.0, high=1.0),
            top_p=number_field(body, "top_p", low=0.0, high=1.0),
            top_k=positive_int(body.get("top_k"), "top_k"),
            seed=None,
            logprobs=False,
            top_logprobs=0,
            ignored=tuple(sorted(k for k in body if k not in _INERT)),
            max_tokens_is_cap=True,
            request_kind=_request_kind(chat.messages),
            history_ends=chat.history_ends,
        )

    def parse_for_count(self, body: dict, *, relayed: bool = False) -> ChatRequest:
        """The conversation and tools alone (what `count_tokens` renders; server tools are left out if relayed)."""
        model = body.get("model", "")
        if not isinstance(model, str):
            raise BadRequest("model must be a string", param="model")
        system = system_messages(body.get("system"))
        elements = body.get("messages")
        if not isinstance(elements, list) or not elements:
            raise BadRequest("messages must be a non-empty list", param="messages")
        converted, ends = convert_messages(elements, start=0, offset=len(system))
        messages = [share(m) for m in system] + converted
        tools = share(tools_of(body.get("tools"), relayed=relayed))
        ensure_serialisable(tools, "tools")
        return ChatRequest(
            model=model, messages=messages, tools=tools, history_ends=ends,
            tools_key=tools_key(tools),
            tool_choice="auto", parallel_tool_calls=True, stream=False, include_usage=True, max_tokens=None,
            temperature=None, top_p=None, top_k=None, seed=None, logprobs=False, top_logprobs=0,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------- replies

    def reply(self, result: TurnResult, chat: ChatRequest, *, model: str) -> dict:
        return {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _blocks(result.message),
            "stop_reason": _STOP_REASONS.get(result.finish_reason, "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
        }

    def stream(self, chat: ChatRequest, *, model: str) -> _MessagesStream:
        return _MessagesStream(model)

    def error(self, error: ApiError) -> tuple[int, dict]:
        status, kind, message = error.status, _ERROR_TYPES.get(error.status, "api_error"), error.message
        if isinstance(error, ContextLengthExceeded) and error.prompt_tokens is not None:
            message = f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
        if isinstance(error, UpstreamUnavailable):
            status, kind = 529, "overloaded_error"
        return status, {"type": "error", "error": {"type": kind, "message": message}}


_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    409: "invalid_request_error", 413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
}


class _MessagesStream:
    keepalive = _sse("ping", {"type": "ping"})

    def __init__(self, model: str) -> None:
        self.model = model
        self.message_id = _message_id()

    def _start(self, input_tokens: int) -> bytes:
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": input_tokens, "output_tokens": 0}}  # fmt: skip
        return _sse("message_start", {"type": "message_start", "message": message})

    def opening(self) -> bytes:
        return self._start(0)  # the prompt's size is told again in message_delta

    def events(self, result: TurnResult, *, opened: bool) -> bytes:
        out = [] if opened else [self._start(result.prompt_tokens)]
        for index, block in enumerate(_blocks(result.message)):
            kind = block["type"]
            if kind == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            elif kind == "thinking":
                start, delta = {"type": "thinking", "thinking": "", "signature": ""}, {
                    "type": "thinking_delta", "thinking": block["thinking"]}  # fmt: skip
            else:  # tool_use: the input goes as JSON deltas (input filled in up front is ignored by Claude Code)
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": start}))  # fmt: skip
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            if kind == "thinking":
                out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "signature_delta", "signature": ""}}))
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        usage = {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}
        stop = {"stop_reason": _STOP_REASONS.get(result.finish_reason, "end_turn"), "stop_sequence": None}
        out.append(_sse("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}))
        out.append(_sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def failure(self, error: ApiError) -> bytes:
        _, body = MESSAGES.error(error)
        return _sse("error", body)


def _message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def _blocks(message: dict) -> list[dict]:
    """An assistant message of the gate as Messages content blocks."""
    blocks: list[dict] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = None
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": arguments if isinstance(arguments, dict) else {}})  # fmt: skip
    return blocks or [{"type": "text", "text": ""}]


def _continued(previous: ChatRequest, reused: int, body: dict) -> ChatRequest:
    """The request in `body`, whose fields other than `messages` and whose first `reused` history elements are byte
    for byte those of the body `previous` was parsed from: only the new elements are converted."""
    kept = previous.history_ends[reused - 1]
    converted, ends = convert_messages(body["messages"][reused:], start=reused, offset=kept)
    messages = previous.messages[:kept] + converted
    return replace(previous, messages=messages, history_ends=previous.history_ends[:reused] + ends,
                   request_kind=_request_kind(messages), carried=(previous.messages, kept))  # fmt: skip


def _request_kind(messages: list[dict]) -> str | None:
    """"compaction" when the last user message asks for Claude Code's summary of the conversation."""
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return "compaction" if last_user is not None and _COMPACTION_ASK in last_user["content"] else None


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    return stream


MESSAGES = MessagesDialect()
