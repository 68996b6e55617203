"""The OpenAI chat wire protocol, requests: parse what agents send (`replies.py` builds what they expect back).

This is the one module that knows field names. Every option that changes what the model says is honoured or
refused: `tool_choice` ("auto", "none"), `parallel_tool_calls`, `logprobs`/`top_logprobs` are honoured; what the
policy cannot do token-exactly (`n > 1`, stop strings, penalties, logit bias, a forced or named tool choice,
structured output, images) is a `BadRequest` that names the field. Fields that change nothing about the answer
(`store`, `metadata`, `user`, ...) are accepted; any other unknown field is accepted and reported back to the
caller in `ChatRequest.ignored` (the server notes it on the rollout). Free-form JSON (tools, arguments) must be
serialisable (orjson's depth limit), so a request that parses can always be recorded.

Messages are normalised once, here, into the plain dicts a chat template expects:
- content given as a list of text parts is joined with "\n" (as vLLM does); `developer` becomes `system`;
- an assistant message always has `content` (a string, "" when the agent sent `null`), `tool_calls` only when it
  has some, and `reasoning_content` when the agent echoed it (`reasoning` is accepted as an alias).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import orjson

from interceptor.digests import digest
from interceptor.errors import BadRequest

__all__ = [
    "ChatRequest", "continue_chat_request", "ensure_serialisable", "normalize_messages", "number_field", "parse_chat_request", "parse_json_body",
    "positive_int", "same_json", "tools_key", "typed_field",
]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[dict]
    tools: list[dict] | None
    tools_key: bytes  # `tools_key(tools)`: what branches compare
    tool_choice: str  # auto | none
    parallel_tool_calls: bool
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    logprobs: bool
    top_logprobs: int
    ignored: tuple[str, ...] = ()  # unknown fields, accepted and not acted on
    # max_tokens as an upper bound the room left in the context also bounds (Anthropic's meaning), rather than a
    # length the context must hold (OpenAI's: asking for more than fits is a context-length error)
    max_tokens_is_cap: bool = False
    # What the agent says the request is for, when it says so (Codex: "turn", "compaction"): a side request's
    # sample records it as its fork reason
    request_kind: str | None = None
    # Where each element of the body's history ends in `messages`, for a dialect whose elements each become
    # several messages (Messages: a user turn of tool results); lets the next body's request reuse them
    history_ends: tuple[int, ...] = ()
    # (an earlier request's `messages` list, n): this request's first n messages are that list's first n, the very
    # same objects (its body repeated that one's history byte for byte). The list itself, not its id: an id names
    # another list once this one is freed.
    carried: tuple[list[dict] | None, int] = field(default=(None, 0), compare=False, repr=False)


# Fields that change nothing about the answer: accepted as they come.
_INERT_FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "store", "metadata", "user", "service_tier",
    "prompt_cache_key", "safety_identifier", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "seed", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "n", "stop",
    "response_format", "modalities",
})
# Options the policy cannot honour token-exactly: refused unless they hold their neutral value.
_NEUTRAL = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "logit_bias": ({},),
    "reasoning_effort": (),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "functions": (),
    "function_call": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "structured_outputs": (),
}
_MAX_TOP_LOGPROBS = 20  # OpenAI's limit
_INT64 = 2**63


def parse_json_body(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_chat_request(body: dict, *, relayed: bool = False) -> ChatRequest:
    """The request, typed. `relayed` (black_box): the body goes upstream as it came, so the upstream honours its
    options; only what the interceptor itself reads (messages, tools, stream) is checked."""
    if not relayed:
        _refuse_what_the_policy_cannot_honour(body)
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_tool(t) for t in tools)):
        raise BadRequest("tools must be a list of {'type': 'function', 'function': {'name': ...}}", param="tools")
    tools = tools or None
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage must be a boolean", param="stream_options")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    logprobs = typed_field(body, "logprobs", bool, default=False)
    top_logprobs = _optional_int(body, "top_logprobs", low=0, high=_MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return ChatRequest(
        model=typed_field(body, "model", str, default=""),
        messages=normalize_messages(body.get("messages")),
        tools=tools,
        tools_key=tools_key(tools),
        tool_choice="auto" if relayed else _tool_choice(body.get("tool_choice")),
        parallel_tool_calls=typed_field(body, "parallel_tool_calls", bool, default=True),
        stream=typed_field(body, "stream", bool, default=False),
        include_usage=include_usage,
        max_tokens=positive_int(max_tokens, "max_tokens"),
        temperature=number_field(body, "temperature", low=0.0, high=2.0),
        top_p=number_field(body, "top_p", low=0.0, high=1.0),
        top_k=_optional_int(body, "top_k", low=-1, high=_INT64 - 1),
        seed=_optional_int(body, "seed", low=0, high=_INT64 - 1),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignored=() if relayed else tuple(sorted(k for k in body if k not in _INERT_FIELDS and k not in _NEUTRAL)),
    )


def continue_chat_request(previous: ChatRequest, body: dict, reused: int) -> ChatRequest:
    """The request in `body`, whose fields other than `messages`, and whose first `reused` messages, are byte for
    byte those of the body `previous` was parsed from (`body_cache.py`): only the new messages are read."""
    messages = body["messages"]
    added = [_normalize_message(m, i) for i, m in enumerate(messages[reused:], start=reused)]
    return replace(previous, messages=previous.messages[:reused] + added, carried=(previous.messages, reused))


def _refuse_what_the_policy_cannot_honour(body: dict) -> None:
    n = body.get("n")
    if n not in (None, 1) or isinstance(n, bool):
        raise BadRequest("only n=1 is supported", param="n")
    if body.get("stop"):
        raise BadRequest("stop sequences are not supported; the model's end-of-turn token ends a turn", param="stop")
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if value is not None and not any(value == v and type(value) is type(v) for v in neutral):
            raise BadRequest(
                f"{key} is not supported: the policy samples from its own distribution, so that the recorded "
                "logprobs are the ones it trains on", param=key,
            )
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise BadRequest("response_format other than {'type': 'text'} is not supported", param="response_format")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise BadRequest("only the text modality is supported", param="modalities")


def _tool_choice(value: object) -> str:
    if value is None or value == "auto":
        return "auto"
    if value == "none":
        return "none"
    if value == "required" or isinstance(value, dict):
        raise BadRequest(
            "tool_choice 'required' or naming a function is not supported: the policy's own sampling decides "
            "whether it calls a tool (use 'auto' or 'none')", param="tool_choice",
        )
    raise BadRequest("tool_choice must be 'auto' or 'none'", param="tool_choice")


def tools_key(tools: list[dict] | None) -> bytes:
    """What identifies a tool list whatever the order of its keys: the digest of its sorted-keys JSON (b"" for none)."""
    try:
        return digest(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)) if tools else b""
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"tools cannot be serialised: {exc}", param="tools") from exc


_RECORD_NESTING = 4  # levels a stored value sits below the top of a record or journal line, with room to spare


def ensure_serialisable(value: object, param: str) -> None:
    """A `BadRequest` for JSON that parsed but cannot be written back where it will be stored (nested past
    orjson's depth limit once inside a record)."""
    wrapped = value
    for _ in range(_RECORD_NESTING):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"{param} is nested too deeply to be recorded: {exc}", param=param) from exc


def normalize_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    return [_normalize_message(m, i) for i, m in enumerate(messages)]


def _normalize_message(message: object, index: int) -> dict:
    """The message in normal form: the agent's own dict when it already is (most are), so that an idle rollout
    holds each message once (the body cache keeps the parsed dicts for the next request); else a new dict."""
    normalized = _normal_form(message, index)
    return message if same_json(message, normalized) else normalized


def same_json(message: dict, normalized: dict) -> bool:
    """Whether a message serialises as a message in normal form does: equal, with their keys in the same order (a
    normal message holds only strings, so equal values are equal JSON)."""
    if list(message) != list(normalized) or message != normalized:
        return False
    calls = normalized.get("tool_calls")
    return not calls or all(list(a) == list(b) and list(a["function"]) == list(b["function"])
                            for a, b in zip(message["tool_calls"], calls))


def _normal_form(message: object, index: int) -> dict:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{param} must be an object", param=param)
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise BadRequest(f"{param}.role {repr(role)[:40]} is not one of {sorted(_ROLES)}", param=f"{param}.role")
    content = _text(message.get("content"), f"{param}.content")
    if role == "developer":
        role = "system"
    if role == "assistant":
        normalized: dict = {"role": "assistant", "content": content}
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if isinstance(reasoning, str) and reasoning:
            normalized["reasoning_content"] = reasoning
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise BadRequest(f"{param}.tool_calls must be a list", param=f"{param}.tool_calls")
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
        try:
            arguments = json.dumps(arguments, ensure_ascii=False)
        except (RecursionError, ValueError, TypeError) as exc:
            raise BadRequest(f"{param}.function.arguments cannot be serialised: {exc}", param=param) from exc
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
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("parameters", {}), dict)
    )


def typed_field(body: dict, key: str, kind: type, *, default):
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise BadRequest(f"{key} must be a {kind.__name__}", param=key)
    return value


def number_field(body: dict, key: str, *, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key} must be a number from {low} to {high}", param=key)
    return float(value)


def _optional_int(body: dict, key: str, *, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer from {low} to {high}", param=key)
    return value


def positive_int(value: object, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < _INT64:
        raise BadRequest(f"{key} must be a positive integer", param=key)
    return value
