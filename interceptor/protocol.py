"""The OpenAI chat wire protocol: parse what agents send, build what they expect back.

This is the one module that knows field names. It parses only what the interceptor uses, accepts and ignores
unknown fields (`store`, `metadata`, `parallel_tool_calls`, ...), and rejects what it cannot honour (`n > 1`,
image parts, unknown roles) with a `BadRequest` that names the field.

Messages are normalised once, here, into the plain dicts a chat template expects:
- content given as a list of text parts is joined with "\n" (as vLLM does); `developer` becomes `system`;
- an assistant message always has `content` (a string, "" when the agent sent `null`), `tool_calls` only when it
  has some, and `reasoning_content` when the agent echoed it (`reasoning` is accepted as an alias).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson

from .errors import BadRequest
from .parsing import ParsedOutput

__all__ = [
    "ChatRequest",
    "SSE_DONE",
    "Usage",
    "assistant_message",
    "chat_chunks",
    "chat_completion",
    "encode_sse",
    "finish_reason_for",
    "new_completion_id",
    "new_tool_call_id",
    "normalize_messages",
    "parse_chat_request",
    "parse_json_body",
]

SSE_DONE = b"data: [DONE]\n\n"
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[dict]
    tools: list[dict] | None
    tool_choice: object
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def parse_json_body(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_chat_request(body: dict) -> ChatRequest:
    n = body.get("n")
    if n not in (None, 1):
        raise BadRequest("only n=1 is supported", param="n")
    if body.get("stop"):
        raise BadRequest("stop sequences are not supported; the model's end-of-turn token ends a turn", param="stop")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_tool(t) for t in tools)):
        raise BadRequest("tools must be a list of {'type': 'function', 'function': {'name': ...}}", param="tools")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        model=_typed(body, "model", str, default=""),
        messages=normalize_messages(body.get("messages")),
        tools=tools or None,
        tool_choice=body.get("tool_choice"),
        stream=_typed(body, "stream", bool, default=False),
        include_usage=bool(stream_options.get("include_usage", False)),
        max_tokens=_positive_int(max_tokens, "max_tokens"),
        temperature=_number(body, "temperature", low=0.0, high=2.0),
        top_p=_number(body, "top_p", low=0.0, high=1.0),
        top_k=_optional_int(body, "top_k"),
        seed=_optional_int(body, "seed"),
    )


def normalize_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    return [_normalize_message(m, i) for i, m in enumerate(messages)]


def _normalize_message(message: object, index: int) -> dict:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{param} must be an object", param=param)
    role = message.get("role")
    if role not in _ROLES:
        raise BadRequest(f"{param}.role {role!r} is not one of {sorted(_ROLES)}", param=f"{param}.role")
    content = _text(message.get("content"), f"{param}.content")
    if role == "developer":
        role = "system"
    if role == "assistant":
        normalized: dict = {"role": "assistant", "content": content}
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if isinstance(reasoning, str) and reasoning:
            normalized["reasoning_content"] = reasoning
        calls = message.get("tool_calls")
        if calls:
            normalized["tool_calls"] = [_normalize_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(calls)]
        return normalized
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise BadRequest(f"{param}.tool_call_id must be a string", param=f"{param}.tool_call_id")
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    return {"role": role, "content": content}


def _normalize_call(call: object, param: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest(f"{param} must have function.name", param=param)
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = call.get("id")
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _text(content: object, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "input_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "input_image", "image", "input_audio", "file"):
                raise BadRequest(f"{param}: {kind} parts are not supported; send text only", param=param)
            else:
                raise BadRequest(f"{param}: content parts must be {{'type': 'text', 'text': ...}}", param=param)
        return "\n".join(texts)
    raise BadRequest(f"{param} must be a string, a list of text parts, or null", param=param)


def _is_tool(tool: object) -> bool:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return False
    function = tool.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def _typed(body: dict, key: str, kind: type, *, default):
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise BadRequest(f"{key} must be a {kind.__name__}", param=key)
    return value


def _number(body: dict, key: str, *, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key} must be a number from {low} to {high}", param=key)
    return float(value)


def _optional_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer", param=key)
    return value


def _positive_int(value: object, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{key} must be a positive integer", param=key)
    return value


# ----------------------------------------------------------------------------------------------- responses


def new_completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def new_tool_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def assistant_message(parsed: ParsedOutput, call_ids: Sequence[str]) -> dict:
    """The OpenAI assistant message for a parsed output; `call_ids` gives one id per tool call."""
    message: dict = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call_id, call in zip(call_ids, parsed.calls, strict=True)
        ]
    return message


def finish_reason_for(message: dict, upstream_reason: str | None) -> str:
    """OpenAI's finish reason: `tool_calls` when the turn ended with calls, else the upstream's (`stop`/`length`)."""
    if message.get("tool_calls") and upstream_reason != "length":
        return "tool_calls"
    return upstream_reason or "stop"


def chat_completion(
    *, completion_id: str, model: str, message: dict, finish_reason: str, usage: Usage, created: int | None = None
) -> dict:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage.as_dict(),
    }


def chat_chunks(
    *,
    completion_id: str,
    model: str,
    message: dict,
    finish_reason: str,
    usage: Usage | None,
    created: int | None = None,
) -> Iterator[dict]:
    """The chunks OpenAI streams for one message: a role delta, reasoning, content, tool calls (name, then
    arguments), the finish reason, and the usage chunk when `usage` is given. `[DONE]` is the caller's."""
    created = created if created is not None else int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield chunk({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        head = {"name": call["function"]["name"], "arguments": ""}
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": head}]})
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]})
    yield chunk({}, finish_reason)
    if usage is not None:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage.as_dict(),
        }


def encode_sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"
