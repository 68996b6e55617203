"""OpenAI chat completions as a dialect: requests are `protocol.py`'s, replies `replies.py`'s.

A request without tools whose system prompt opens like Pi's (0.73) or OpenCode's (1.18) summariser is
`request_kind` "compaction": noted as a side request, and the sample it starts says so. A context overflow is
answered in OpenAI's words (`errors.ContextLengthExceeded`): "This model's maximum context length is N tokens", which
both agents' overflow patterns match (`maximum context length is \\d+ tokens`): they compact and go on (what follows
differs: agents/specs/pi.py, agents/specs/opencode.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from aiohttp import web

from interceptor.errors import ApiError, error_body
from interceptor.wire.protocol import ChatRequest, continue_chat_request, parse_chat_request
from interceptor.wire.replies import SSE_DONE, Usage, chat_chunks, chat_completion, encode_sse, new_completion_id

if TYPE_CHECKING:  # annotations only: importing rollouts brings the renderer (transformers, torch)
    from interceptor.rollouts import TurnResult

__all__ = ["CHAT", "ChatDialect"]

# How the summariser's system prompt opens: Pi's "You are a context summarization assistant.", OpenCode's "... agent."
_COMPACTION_SYSTEM = "You are a context summarization"


class _ChatStream:
    keepalive = b": keepalive\n\n"  # an SSE comment: openai-python, the OpenAI Node SDK and eventsource-parser skip it

    def __init__(self, chat: ChatRequest, model: str) -> None:
        self.chat = chat
        self.model = model
        self.completion_id = new_completion_id()

    def _chunks(self, result: TurnResult | None):
        usage = Usage(result.prompt_tokens, result.completion_tokens) if result and self.chat.include_usage else None
        return chat_chunks(
            completion_id=self.completion_id,
            model=self.model,
            message=result.message if result else {},
            finish_reason=result.finish_reason if result else "stop",
            usage=usage,
            logprobs=result.logprobs if result else None,
        )

    def opening(self) -> bytes:
        return encode_sse(next(self._chunks(None)))  # the role delta

    def events(self, result: TurnResult, *, opened: bool) -> bytes:
        chunks = self._chunks(result)
        if opened:
            next(chunks)
        return b"".join(encode_sse(c) for c in chunks) + SSE_DONE

    def failure(self, error: ApiError) -> bytes:
        return encode_sse(error_body(error)) + SSE_DONE


class ChatDialect:
    name = "chat"
    path = "chat/completions"
    history_key = "messages"

    def authorization(self, request: web.Request) -> str | None:
        return request.headers.get("Authorization")

    def parse(self, body: dict, *, relayed: bool = False, continues: tuple[ChatRequest, int] | None = None) -> ChatRequest:
        if continues is not None:  # one message per history element: the earlier ones are already normalised
            return continue_chat_request(continues[0], body, continues[1])
        chat = parse_chat_request(body, relayed=relayed)
        if chat.request_kind is None and _asks_for_compaction(chat):
            chat = replace(chat, request_kind="compaction")
        return chat

    def reply(self, result: TurnResult, chat: ChatRequest, *, model: str) -> dict:
        return chat_completion(
            completion_id=new_completion_id(),
            model=model,
            message=result.message,
            finish_reason=result.finish_reason,
            usage=Usage(result.prompt_tokens, result.completion_tokens),
            logprobs=result.logprobs,
        )

    def stream(self, chat: ChatRequest, *, model: str) -> _ChatStream:
        return _ChatStream(chat, model)

    def error(self, error: ApiError) -> tuple[int, dict]:
        return error.status, error_body(error)


def _asks_for_compaction(chat: ChatRequest) -> bool:
    first = chat.messages[0]
    return (not chat.tools and first["role"] == "system" and isinstance(first.get("content"), str)
            and first["content"].startswith(_COMPACTION_SYSTEM))


CHAT = ChatDialect()
