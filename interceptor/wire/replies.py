"""The OpenAI chat wire protocol, replies: the completion, its stream of chunks, logprobs and ids, built from a
parsed model output (requests are `protocol.py`'s)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson

from interceptor.wire.parsing import ParsedOutput

__all__ = [
    "SSE_DONE",
    "Usage",
    "assistant_message",
    "chat_chunks",
    "chat_completion",
    "encode_sse",
    "finish_reason_for",
    "new_completion_id",
    "new_tool_call_id",
    "token_logprobs",
]

SSE_DONE = b"data: [DONE]\n\n"


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


# Ids the agent sees, unique and not secret: drawn from a generator seeded from the OS, without a system call each
_ids = random.Random()


def new_completion_id() -> str:
    return f"chatcmpl-{_ids.getrandbits(96):024x}"


def new_tool_call_id() -> str:
    return f"call_{_ids.getrandbits(96):024x}"


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


def token_logprobs(tokens: Sequence[str], logprobs: Sequence[float], tops: Sequence[dict] | None) -> dict:
    """OpenAI's `choices[].logprobs` for the sampled tokens (their text, logprob, UTF-8 bytes, and alternatives)."""

    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = []
    for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        item = entry(token, logprob)
        item["top_logprobs"] = [entry(t, lp) for t, lp in tops[i].items()] if tops else []
        content.append(item)
    return {"content": content, "refusal": None}


def chat_completion(
    *,
    completion_id: str,
    model: str,
    message: dict,
    finish_reason: str,
    usage: Usage,
    logprobs: dict | None = None,
    created: int | None = None,
) -> dict:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": usage.as_dict(),
    }


def chat_chunks(
    *,
    completion_id: str,
    model: str,
    message: dict,
    finish_reason: str,
    usage: Usage | None,
    logprobs: dict | None = None,
    created: int | None = None,
) -> Iterator[dict]:
    """The chunks OpenAI streams for one message: a role delta, reasoning, content, tool calls (name, then
    arguments), the finish reason (with the logprobs when asked for), and the usage chunk when `usage` is given.
    `[DONE]` is the caller's."""
    created = created if created is not None else int(time.time())

    def chunk(delta: dict, finish: str | None = None, chunk_logprobs: dict | None = None) -> dict:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": chunk_logprobs, "finish_reason": finish}],
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
    yield chunk({}, finish_reason, logprobs)
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
