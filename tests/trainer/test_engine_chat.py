"""The local engine's /v1/chat/completions, driven by the real `openai` SDK, streaming and not."""

from __future__ import annotations

import openai
import pytest

from interceptor.wire.parsing import parse_output
from trainer.engine.textcodec import TokenTexts

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus three"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture
async def client(engine):
    async with openai.AsyncOpenAI(base_url=engine.base_url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


async def test_chat_completion_renders_the_template_and_answers_in_openai_form(client, engine):
    reply = await client.chat.completions.create(
        model=engine.model_name, messages=MESSAGES, tools=TOOLS, max_tokens=12, seed=4
    )

    [choice] = reply.choices
    assert reply.object == "chat.completion" and reply.model == engine.model_name
    assert choice.message.role == "assistant"
    assert choice.finish_reason in {"length", "stop", "tool_calls"}
    assert reply.usage.completion_tokens == 12 or choice.finish_reason != "length"
    tokenizer = engine.core.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    # The same turn generated in-process and parsed: the chat endpoint answers with exactly what was sampled.
    same = await engine.generate(tokenizer.encode(prompt, add_special_tokens=False), _params(max_tokens=12, seed=4))
    parsed = parse_output(TokenTexts(tokenizer).text(same), tools=TOOLS)
    assert choice.message.content == parsed.content
    assert [call.function.name for call in choice.message.tool_calls or ()] == [call.name for call in parsed.calls]


async def test_streamed_chat_delivers_the_same_message_as_a_whole_one(client, engine):
    whole = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=16, seed=9)
    stream = await client.chat.completions.create(
        model=engine.model_name,
        messages=MESSAGES,
        max_tokens=16,
        seed=9,
        stream=True,
        stream_options={"include_usage": True},
    )

    chunks = [chunk async for chunk in stream]
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == (whole.choices[0].message.content or "")
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_chat_over_the_context_length_is_a_400_the_sdk_reports(client, engine):
    with pytest.raises(openai.BadRequestError, match="maximum input length"):
        await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=8190)


async def test_chat_with_a_bad_message_is_a_400_and_the_engine_keeps_serving(client, engine):
    with pytest.raises(openai.BadRequestError, match="role"):
        await client.chat.completions.create(model=engine.model_name, messages=[{"role": "robot", "content": "hi"}])

    reply = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


def _params(**fields):
    from trainer.engine import SamplingParams

    return SamplingParams(**fields)
