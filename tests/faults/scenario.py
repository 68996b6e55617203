"""What the fault tests share: the conversation, a good first turn, and the checks on an error and on a record."""

from __future__ import annotations

import math

import aiohttp

from interceptor import RolloutHandle, RolloutRecord
from tests.fakes import Call
from tests.faults.agent import Answer, chat
from tests.faults.upstream import FaultUpstream, Reply

__all__ = [
    "FIRST_MESSAGES",
    "FOLLOW_UP",
    "GOOD_TEXT",
    "assert_only_good_turns",
    "assert_openai_error",
    "conversation",
    "request",
]

GOOD_TEXT = "The answer is 42."
FIRST_MESSAGES = [{"role": "user", "content": "What is six times seven?"}]
FOLLOW_UP = {"role": "user", "content": "Are you sure?"}


def request(messages: list[dict], stream: bool) -> dict:
    return {"model": "policy", "messages": messages, "stream": stream}


async def conversation(
    http: aiohttp.ClientSession, handle: RolloutHandle, upstream: FaultUpstream, *, turn: str, stream: bool
) -> list[dict]:
    """The messages of the turn under test: the first question (`first_turn`), or, for `later_turn`, the
    follow-up after one good turn the upstream answered with GOOD_TEXT."""
    messages = list(FIRST_MESSAGES)
    if turn == "first_turn":
        return messages
    upstream.script(Reply(GOOD_TEXT))
    good = await chat(http, handle.base_url, handle.secret, body=request(messages, stream))
    assert good.status == 200 and good.content == GOOD_TEXT, good.raw
    return [*messages, {"role": "assistant", "content": GOOD_TEXT}, FOLLOW_UP]


def assert_openai_error(answer: Answer, code: str | None) -> None:
    """The body (or a stream's error event) is OpenAI's error object with this code."""
    try:
        error = answer.error
    except ValueError as exc:  # orjson.JSONDecodeError: not the OpenAI shape at all
        raise AssertionError(f"not an OpenAI error body: {answer.raw[:300]!r}") from exc
    assert error is not None, answer.raw[:300]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["code"] == code, error


def assert_only_good_turns(record: RolloutRecord, good_calls: list[Call]) -> None:
    """The record holds the good turn exactly as the upstream sampled it (or no sampled token when there was no
    good turn): a failed turn leaves no tokens, no partial turn, no padded logprob."""
    if not good_calls:
        assert all(sum(s.completion_mask) == 0 for s in record.samples), record.samples
        return
    [sample] = record.samples
    [call] = good_calls
    prompt, sampled = call.prompt_ids, call.token_ids
    assert len(sample.input_ids) == len(sample.completion_mask) == len(sample.old_logprobs)
    assert sample.input_ids == prompt + sampled
    assert sample.completion_mask == [0] * len(prompt) + [1] * len(sampled)
    assert sample.old_logprobs[: len(prompt)] == [0.0] * len(prompt)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(sample.old_logprobs[len(prompt) :], call.logprobs))
    assert len(sample.turns) == 1
