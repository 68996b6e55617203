"""`POST /v1/chat/completions`, so the engine can serve agents directly and be the upstream of black_box mode.

The request is parsed by `interceptor.wire.protocol` (the project's one chat wire module), rendered with the model's
own chat template and tools (`add_generation_prompt=True`, as vLLM does: template to text, then tokenize without
adding special tokens), generated like a completion, and the sampled text is split into reasoning, content and
tool calls by `interceptor.wire.parsing`. Length checks and their wording are vLLM's: without `max_tokens`, the
generation may use the rest of the context.

Streaming sends the SSE headers at once and the chunks of the whole message when the turn is done: tool calls are
only known once their closing tag is sampled. An error after the headers is sent as an SSE `error` event, then
`[DONE]`, as vLLM does.
"""

from __future__ import annotations

import time

from aiohttp import web
from jinja2 import TemplateError

from interceptor.wire.parsing import parse_output
from interceptor.wire.protocol import ChatRequest, parse_chat_request, parse_json_body
from interceptor.wire.replies import (
    SSE_DONE,
    Usage,
    assistant_message,
    chat_chunks,
    chat_completion,
    encode_sse,
    finish_reason_for,
    new_completion_id,
    new_tool_call_id,
)

from trainer.engine.core import EngineCore
from trainer.engine.errors import EngineError, InvalidRequest, error_body
from trainer.engine.generation import GenerationResult
from trainer.engine.http.checks import build_sampling_params, check_context_length, check_model
from trainer.engine.http.keys import CORE, TEXTS
from trainer.engine.sampling import SamplingParams

__all__ = ["handle_chat_completions"]


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    chat = parse_chat_request(parse_json_body(await request.read()))
    check_model(chat.model, core.config.model_name)
    _refuse_unhonoured(chat)
    prompt_ids = _render(core, chat)
    max_tokens = check_context_length(len(prompt_ids), chat.max_tokens, core.max_model_len)
    params = _sampling(core, chat, max_tokens=max_tokens)
    if chat.stream:
        return await _stream(request, core, chat, prompt_ids, params)
    result = await core.generate(prompt_ids, params)
    message, finish_reason = _message(request, chat, result)
    body = chat_completion(
        completion_id=new_completion_id(),
        model=core.config.model_name,
        message=message,
        finish_reason=finish_reason,
        usage=Usage(len(prompt_ids), len(result.token_ids)),
    )
    return web.json_response(body)


async def _stream(
    request: web.Request, core: EngineCore, chat: ChatRequest, prompt_ids: list[int], params: SamplingParams
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    completion_id, created = new_completion_id(), int(time.time())
    try:
        result = await core.generate(prompt_ids, params)
    except EngineError as exc:
        await response.write(encode_sse(error_body(exc)))
    else:
        message, finish_reason = _message(request, chat, result)
        usage = Usage(len(prompt_ids), len(result.token_ids)) if chat.include_usage else None
        for chunk in chat_chunks(
            completion_id=completion_id,
            model=core.config.model_name,
            message=message,
            finish_reason=finish_reason,
            usage=usage,
            created=created,
        ):
            await response.write(encode_sse(chunk))
    await response.write(SSE_DONE)
    await response.write_eof()
    return response


def _render(core: EngineCore, chat: ChatRequest) -> list[int]:
    tokenizer = core.tokenizer
    try:
        text = tokenizer.apply_chat_template(
            chat.messages, tools=chat.tools, add_generation_prompt=True, tokenize=False
        )
    except TemplateError as exc:  # the template's own raise_exception: a request it cannot render
        raise InvalidRequest(f"the chat template cannot render these messages: {exc}", param="messages") from exc
    return tokenizer.encode(text, add_special_tokens=False)


def _sampling(core: EngineCore, chat: ChatRequest, *, max_tokens: int) -> SamplingParams:
    if chat.top_k is not None and chat.top_k < -1:
        raise InvalidRequest(f"top_k must be 0 (disable), or at least 1, got {chat.top_k}.")
    if chat.top_p is not None and chat.top_p <= 0.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {chat.top_p}.", param="top_p", value=chat.top_p)
    return build_sampling_params(
        core.policy.default_sampling,
        max_tokens=max_tokens,
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        seed=None if chat.seed == -1 else chat.seed,
        stop_token_ids=(),
        ignore_eos=False,
        logprobs=None,
        prompt_logprobs=None,
        min_tokens=0,
        logit_bias=(),
    )


def _refuse_unhonoured(chat: ChatRequest) -> None:
    """This debugging chat route does not implement every option the interception server honours: refuse them."""
    for param, honoured in (("logprobs", not chat.logprobs), ("tool_choice", chat.tool_choice == "auto"),
                            ("parallel_tool_calls", chat.parallel_tool_calls)):
        if not honoured:
            raise InvalidRequest(f"{param} is not supported by the engine's chat route; the interception server "
                                 "honours it", param=param)


def _message(request: web.Request, chat: ChatRequest, result: GenerationResult) -> tuple[dict, str]:
    parsed = parse_output(request.app[TEXTS].text(result), tools=chat.tools)
    message = assistant_message(parsed, [new_tool_call_id() for _ in parsed.calls])
    return message, finish_reason_for(message, result.finish_reason)
