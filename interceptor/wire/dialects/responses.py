"""The OpenAI Responses API as a dialect: `POST /v1/responses`, as Codex CLI and the `openai` SDKs speak it.

Nothing is stored here (`store: false`): each request carries the whole history; `previous_response_id`,
`conversation`, `prompt`, `background` are refused. Requests become the gate's OpenAI-style conversation:
- `instructions` is a leading system message; `input` as a string is one user message;
- `message` items (an item with a `role` and no `type` is one too): `input_text`/`output_text` parts joined with
  "\n", `developer` becomes `system`; images and files are refused;
- `function_call` items are tool calls (id `call_id`, arguments as sent) on the assistant message before them, or
  on a new one: an assistant message and the calls after it are one assistant turn, as the policy sampled it;
- `function_call_output` items are `tool` messages (a string, or text parts joined with "\n");
- `reasoning` items: their text (`content`, else `summary`) becomes the next assistant turn's
  `reasoning_content`; one with encrypted content only (reasoning this policy never produced) is dropped, as the
  Messages dialect drops `redacted_thinking`. Any other item type is refused with a 400 that names it;
- `function` tools become function tools (`strict` is neither rendered nor enforced: the policy's own sampling
  writes the arguments); a `namespace` tool (Codex's sub-agent tools, `multi_agent_v1`) is its functions, each
  named `NAMESPACE.NAME` for the policy, and a call of one is a `function_call` with `namespace` and `name` both
  ways; a built-in tool (`web_search`, `local_shell`, `custom`, ...) is refused;
- `tool_choice` auto/none and `parallel_tool_calls` honoured; `required` or a named tool refused, as in chat;
  `max_output_tokens` is chat's `max_tokens` (more than the context holds is a context-length error);
  `temperature`, `top_p` honoured unless the rollout pins them; `text.format` other than text refused;
  `store`, `metadata`, `user`, `service_tier`, `prompt_cache_key`, `safety_identifier`, `stream_options` change
  nothing; anything else (`reasoning`, `include`, `truncation`, ...) is accepted and noted as not acted on;
  `client_metadata`'s `x-codex-turn-metadata.request_kind` tells a compaction from a turn: a compaction that
  starts a new sample has "compaction request" as its fork reason; a turn with `x-openai-subagent` set is a
  sub-agent's (`request_kind` "subagent": its chain is placed as one, even when it starts from its parent's
  history, as `spawn_agent(fork_context=true)` does).

Replies: a `response` whose `output` holds a `reasoning` item (the text as one `summary_text`, no encrypted
content), a `message` item with one `output_text`, and a `function_call` item per call (`call_id` the gate's tool
call id); status `incomplete` (`max_output_tokens`) when the generation was cut by length. Streams:
`response.created`, `response.in_progress`, per item `output_item.added`, its part and text or argument deltas and
dones, `output_item.done`, then `response.completed` (or `response.incomplete`), every event numbered by
`sequence_number`; an SSE comment while a long generation runs; a failure after the headers is `response.failed`
carrying the error's code (`context_length_exceeded` is what Codex stops on). Errors before the headers are
OpenAI's shape, with chat's statuses. The credential is `Authorization: Bearer`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from interceptor.errors import ApiError, BadRequest, error_body
from interceptor.wire.protocol import (
    ChatRequest, ensure_serialisable, number_field, positive_int, tools_key, typed_field,
)
from interceptor.wire.dialects.responses_input import convert_items, input_messages, tool_choice
from interceptor.wire.dialects.responses_input import split_name
from interceptor.wire.dialects.responses_input import tools as tools_of
from interceptor.wire.shared_values import share

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from interceptor.rollouts import TurnResult

__all__ = ["RESPONSES", "ResponsesDialect"]

_NOTED_OK = frozenset({  # fields acted on here, and fields that change nothing about the answer
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "stream", "text", "previous_response_id", "conversation", "prompt", "background",
    "store", "metadata", "user", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options",
})
_STATELESS = ("previous_response_id", "conversation", "prompt")  # all need a response store the gate lacks


def _request_kind(metadata: object) -> str | None:
    """Codex's `client_metadata["x-codex-turn-metadata"].request_kind` ("turn", "compaction"), when present; a
    turn of a sub-agent's thread (`x-openai-subagent` set) is "subagent"."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("x-codex-turn-metadata"), str):
        return None
    try:
        kind = orjson.loads(metadata["x-codex-turn-metadata"]).get("request_kind")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if kind == "turn" and isinstance(metadata.get("x-openai-subagent"), str):
        return "subagent"
    return kind if isinstance(kind, str) and kind else None


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponsesDialect:
    name = "responses"
    path = "responses"
    history_key = "input"

    def authorization(self, request: web.Request) -> str | None:
        return request.headers.get("Authorization")

    # ------------------------------------------------------------------------------------------ requests

    def parse(self, body: dict, *, relayed: bool = False, continues: tuple[ChatRequest, int] | None = None) -> ChatRequest:
        """`relayed` (black_box): the upstream honours every option; only what the trace reads is checked."""
        if continues is not None:
            continued = _continued(*continues, body)
            if continued is not None:
                return continued
        for key in () if relayed else _STATELESS:
            if body.get(key) is not None:
                raise BadRequest(f"{key} is not supported: nothing is stored here (store: false); send the whole "
                                 "history in input", param=key)  # fmt: skip
        if body.get("background") not in (None, False) and not relayed:
            raise BadRequest("background responses are not supported", param="background")
        text = body.get("text")
        ignored = set() if relayed else {k for k in body if k not in _NOTED_OK}
        if text is not None and not relayed:
            if not isinstance(text, dict) or text.get("format", {"type": "text"}) != {"type": "text"}:
                raise BadRequest("text.format other than {'type': 'text'} is not supported", param="text.format")
            ignored.update(f"text.{k}" for k in text if k != "format")  # verbosity: the policy writes as it writes
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("instructions must be a string", param="instructions")
        system = [share({"role": "system", "content": instructions})] if instructions else []
        items = body.get("input")
        if isinstance(items, list) and items:
            converted, history_ends = convert_items(items, start=0, offset=len(system))
            if not converted:
                raise BadRequest("input holds no message", param="input")
        else:
            converted, history_ends = input_messages(items), ()
        messages = system + converted
        tools = share(tools_of(body.get("tools"), relayed=relayed))
        ensure_serialisable(tools, "tools")
        return ChatRequest(
            model=typed_field(body, "model", str, default=""),
            messages=messages,
            tools=tools,
            tools_key=tools_key(tools),
            tool_choice="auto" if relayed else tool_choice(body.get("tool_choice")),
            parallel_tool_calls=True if relayed else typed_field(body, "parallel_tool_calls", bool, default=True),
            stream=typed_field(body, "stream", bool, default=False),
            include_usage=True,
            max_tokens=None if relayed else positive_int(body.get("max_output_tokens"), "max_output_tokens"),
            temperature=None if relayed else number_field(body, "temperature", low=0.0, high=2.0),
            top_p=None if relayed else number_field(body, "top_p", low=0.0, high=1.0),
            top_k=None,
            seed=None,
            logprobs=False,
            top_logprobs=0,
            ignored=tuple(sorted(ignored - {"client_metadata"})),
            request_kind=_request_kind(body.get("client_metadata")),
            history_ends=history_ends,
        )

    # ------------------------------------------------------------------------------------------- replies

    def reply(self, result: TurnResult, chat: ChatRequest, *, model: str) -> dict:
        output = _output_items(result.message, incomplete=result.finish_reason == "length")
        return _response(_new_id("resp"), chat, model, output=output, result=result)

    def stream(self, chat: ChatRequest, *, model: str) -> _ResponsesStream:
        return _ResponsesStream(chat, model)

    def error(self, error: ApiError) -> tuple[int, dict]:
        return error.status, error_body(error)


def _continued(previous: ChatRequest, reused: int, body: dict) -> ChatRequest | None:
    """The request in `body`, whose fields other than `input` and whose first `reused` items are byte for byte
    those of the body `previous` was parsed from: the items after the last of those the conversion can resume
    from are converted (None when there is none)."""
    ends = previous.history_ends
    resume = next((j for j in range(min(reused, len(ends)), 0, -1) if ends[j - 1] >= 0), 0)
    if not resume:
        return None
    kept = ends[resume - 1]
    converted, new_ends = convert_items(body["input"][resume:], start=resume, offset=kept)
    return replace(previous, messages=previous.messages[:kept] + converted, history_ends=ends[:resume] + new_ends,
                   carried=(previous.messages, kept))


def _response(response_id: str, chat: ChatRequest, model: str, *, output: list[dict],
              result: TurnResult | None = None, status: str | None = None, error: dict | None = None) -> dict:
    """A `response` object: in progress (no result yet), completed or incomplete (a result), or failed."""
    incomplete = result is not None and result.finish_reason == "length"
    if status is None:
        status = "in_progress" if result is None else "incomplete" if incomplete else "completed"
    usage = None
    if result is not None:
        usage = {
            "input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": result.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": chat.parallel_tool_calls,
        "temperature": chat.temperature,
        "top_p": chat.top_p,
        "max_output_tokens": chat.max_tokens,
        "tool_choice": chat.tool_choice,
        "tools": [{"type": "function", **tool["function"]} for tool in chat.tools or ()],
        "text": {"format": {"type": "text"}},
        "store": False,
        "metadata": {},
        "usage": usage,
    }


def _output_items(message: dict, *, incomplete: bool) -> list[dict]:
    """An assistant message of the gate as Responses output items: reasoning, text, function calls."""
    status = "incomplete" if incomplete else "completed"
    items: list[dict] = []
    if message.get("reasoning_content"):
        items.append({"type": "reasoning", "id": _new_id("rs"),
                      "summary": [{"type": "summary_text", "text": message["reasoning_content"]}]})  # fmt: skip
    if message.get("content"):
        items.append({"type": "message", "id": _new_id("msg"), "role": "assistant", "status": status,
                      "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})  # fmt: skip
    for call in message.get("tool_calls") or ():
        items.append({"type": "function_call", "id": _new_id("fc"), "call_id": call["id"],
                      **split_name(call["function"]["name"]), "arguments": call["function"]["arguments"],
                      "status": "completed"})  # fmt: skip
    return items


class _ResponsesStream:
    keepalive = b": keepalive\n\n"  # an SSE comment: openai-python and Codex's SSE reader skip it

    def __init__(self, chat: ChatRequest, model: str) -> None:
        self.chat = chat
        self.model = model
        self.response_id = _new_id("resp")
        self._sequence = 0

    def _event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        response = _response(self.response_id, self.chat, self.model, output=[])
        return self._event("response.created", response=response) + self._event("response.in_progress",
                                                                                 response=response)  # fmt: skip

    def events(self, result: TurnResult, *, opened: bool) -> bytes:
        out = [] if opened else [self.opening()]
        incomplete = result.finish_reason == "length"
        output = _output_items(result.message, incomplete=incomplete)
        for index, item in enumerate(output):
            out.append(self._item(index, item))
        final = _response(self.response_id, self.chat, self.model, output=output, result=result)
        out.append(self._event("response.incomplete" if incomplete else "response.completed", response=final))
        return b"".join(out)

    def _item(self, index: int, item: dict) -> bytes:
        kind, item_id = item["type"], item["id"]
        where = {"item_id": item_id, "output_index": index}
        if kind == "reasoning":
            text = item["summary"][0]["text"]
            part = {"type": "summary_text", "text": text}
            events = [
                self._event("response.output_item.added", output_index=index, item={**item, "summary": []}),
                self._event("response.reasoning_summary_part.added", **where, summary_index=0,
                            part={**part, "text": ""}),
                self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text),
                self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part),
            ]  # fmt: skip
        elif kind == "message":
            part = item["content"][0]
            events = [
                self._event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []}),
                self._event("response.content_part.added", **where, content_index=0, part={**part, "text": ""}),
                self._event("response.output_text.delta", **where, content_index=0, delta=part["text"], logprobs=[]),
                self._event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=part),
            ]  # fmt: skip
        else:  # function_call
            events = [
                self._event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""}),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, name=item["name"],
                            arguments=item["arguments"]),
            ]  # fmt: skip
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return b"".join(events)

    def failure(self, error: ApiError) -> bytes:
        failed = {"code": error.code or error.type, "message": error.message}
        response = _response(self.response_id, self.chat, self.model, output=[], status="failed", error=failed)
        return self._event("response.failed", response=response)


RESPONSES = ResponsesDialect()
