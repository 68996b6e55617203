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

from ..errors import ApiError, BadRequest, ContextLengthExceeded, UpstreamUnavailable
from ..protocol import ChatRequest, ensure_serialisable, number_field, positive_int, tools_key
from ..shared_values import share

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from ..rollouts import TurnResult

__all__ = ["MESSAGES", "MessagesDialect"]

_INERT = frozenset({
    "model", "messages", "system", "max_tokens", "stream", "temperature", "top_p", "top_k", "tools", "tool_choice",
    "stop_sequences",
})
# Claude Code's first system block, `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;`, changes from
# request to request (a hash in the version); it is metadata for Anthropic's billing, not prompt.
_BILLING = "x-anthropic-billing-header:"
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
        choice, parallel = _tool_choice(body.get("tool_choice"))
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
        system = _system(body.get("system"))
        elements = body.get("messages")
        if not isinstance(elements, list) or not elements:
            raise BadRequest("messages must be a non-empty list", param="messages")
        converted, ends = _messages(elements, start=0, offset=len(system))
        messages = [share(m) for m in system] + converted
        tools = share(_tools(body.get("tools"), relayed=relayed))
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
    409: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
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


# ---------------------------------------------------------------------------------------- request parts


def _system(system: object) -> list[dict]:
    if isinstance(system, list):  # Claude Code's billing metadata is a block of its own: not prompt text
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(_BILLING))]
    if system is None or system == "" or system == []:
        return []
    return [{"role": "system", "content": _text_of(system, "system")}]


def _continued(previous: ChatRequest, reused: int, body: dict) -> ChatRequest:
    """The request in `body`, whose fields other than `messages` and whose first `reused` history elements are byte
    for byte those of the body `previous` was parsed from: only the new elements are converted."""
    kept = previous.history_ends[reused - 1]
    converted, ends = _messages(body["messages"][reused:], start=reused, offset=kept)
    messages = previous.messages[:kept] + converted
    return replace(previous, messages=messages, history_ends=previous.history_ends[:reused] + ends,
                   request_kind=_request_kind(messages))  # fmt: skip


def _request_kind(messages: list[dict]) -> str | None:
    """"compaction" when the last user message asks for Claude Code's summary of the conversation."""
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return "compaction" if last_user is not None and _COMPACTION_ASK in last_user["content"] else None


def _text_of(content: object, param: str) -> str:
    """A string, or text blocks joined with newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"{param}[{i}] must be a text block", param=param)
            texts.append(block["text"])
        return "\n".join(texts)
    raise BadRequest(f"{param} must be a string or a list of text blocks", param=param)


def _messages(messages: list, *, start: int, offset: int) -> tuple[list[dict], tuple[int, ...]]:
    """The history elements `messages` (numbered from `start`) as chat messages, and where each element's end in
    a list that already holds `offset` messages."""
    out: list[dict] = []
    ends: list[int] = []
    for i, message in enumerate(messages, start=start):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"{param} must be an object with role 'user', 'assistant' or 'system'", param=param)
        content = message.get("content")
        if message["role"] == "system":  # Claude Code sends its environment notes as a system message mid-list
            out.append({"role": "system", "content": _text_of(content, f"{param}.content")})
            ends.append(offset + len(out))
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise BadRequest(f"{param}.content must be a string or a list of blocks", param=f"{param}.content")
        if message["role"] == "user":
            out += _user(blocks, param)
        else:
            out.append(_assistant(blocks, param))
        ends.append(offset + len(out))
    return out, tuple(ends)


def _user(blocks: list, param: str) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{where}.tool_use_id must be a string", param=where)
            content = block.get("content", "")
            text = "" if content is None else _text_of(content, f"{where}.content")
            if block.get("is_error") is True and not text.startswith("Error"):
                text = f"Error: {text}"  # the tool failed: say so, as the agent's own tool output does
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in ("image", "document", "search_result"):
            raise BadRequest(f"{where}: {kind} blocks are not supported; send text only", param=where)
        else:
            raise BadRequest(f"{where}: a user message holds text and tool_result blocks", param=where)
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _assistant(blocks: list, param: str) -> dict:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted reasoning this policy never produced: nothing to render
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequest(f"{where} needs id and name", param=where)
            try:
                arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            except (TypeError, ValueError, RecursionError) as exc:
                raise BadRequest(f"{where}.input cannot be serialised: {exc}", param=where) from exc
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        else:
            raise BadRequest(f"{where}: an assistant message holds text, thinking and tool_use blocks", param=where)
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: object, *, relayed: bool = False) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"{param} must be an object", param=param)
        kind = tool.get("type", "custom")
        if kind != "custom" and relayed:
            continue  # a server tool: the upstream runs it; the trace has no form for it
        if kind != "custom":
            raise BadRequest(f"{param}: server tool type {kind!r} is not supported; define it as a custom tool with "
                             "an input_schema", param=param)  # fmt: skip
        schema = tool.get("input_schema")
        if not isinstance(tool.get("name"), str) or not isinstance(schema, dict):
            raise BadRequest(f"{param} needs a name and an input_schema object", param=param)
        function = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out or None


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    return stream


def _tool_choice(choice: object) -> tuple[str, bool]:
    if choice is None:
        return "auto", True
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "none", "any", "tool"):
        raise BadRequest("tool_choice must be {'type': 'auto' | 'none' | 'any' | 'tool'}", param="tool_choice")
    if choice["type"] in ("any", "tool"):
        raise BadRequest(f"tool_choice {choice['type']!r} is not supported: the policy's own sampling decides whether "
                         "it calls a tool (use 'auto' or 'none')", param="tool_choice")  # fmt: skip
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise BadRequest("tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice")
    return choice["type"], not parallel


MESSAGES = MessagesDialect()
