"""`parse_generation`: a `/v1/completions` reply is a `Generation` only if the policy could have sampled it. At the
edges of each bound: the number of sampled tokens (at least one, at most `max_tokens`, within the context after the
prompt) and each logprob (finite, at most 0 but for float error). The fault matrix (`tests/faults/`) holds the same
faults end to end: a 502 in the agent's dialect, nothing recorded, no reward."""

from __future__ import annotations

import pytest

from interceptor.errors import UpstreamError
from interceptor.transport.upstream import parse_generation

VOCAB = 100


def reply(token_ids: list[int], logprobs: list[float], *, finish_reason: str = "stop",
          tops: list | None = None) -> dict:
    choice = {"token_ids": token_ids, "finish_reason": finish_reason,
              "logprobs": {"token_logprobs": logprobs, "top_logprobs": tops or []}}
    return {"model": "policy", "choices": [choice]}


def parse(body: dict, *, max_tokens: int | None = 4, prompt_tokens: int = 10, max_model_len: int = 16,
          top_logprobs: int = 0):
    return parse_generation(body, model="policy", vocab_size=VOCAB, top_logprobs=top_logprobs, seconds=0.1,
                            max_tokens=max_tokens, prompt_tokens=prompt_tokens, max_model_len=max_model_len)


def refused(body: dict, **bounds) -> str:
    with pytest.raises(UpstreamError) as raised:
        parse(body, **bounds)
    assert raised.value.status == 502
    return raised.value.message


def test_a_reply_within_every_bound_is_a_generation():
    generation = parse(reply([1, 2, 3, 4], [-0.1, 0.0, -0.0, -3.5], finish_reason="length"))
    assert generation.token_ids == [1, 2, 3, 4] and generation.logprobs == [-0.1, 0.0, -0.0, -3.5]


def test_a_logprob_above_zero_is_refused_and_named():
    assert "above 0 (5)" in refused(reply([1, 2], [5.0, 0.25]))
    assert "above 0" in refused(reply([1, 2], [-0.5, 0.001]))


def test_a_logprob_a_few_ulps_above_zero_is_float_error_and_kept():
    assert parse(reply([1], [1e-7])).logprobs == [1e-7]


def test_a_top_logprob_above_zero_is_refused():
    tops = [{"a": -0.1, "b": 2.0}]
    assert "top_logprobs" in refused(reply([1], [-0.1], tops=tops), top_logprobs=2)


def test_no_sampled_token_is_refused():
    assert "no sampled token" in refused(reply([], [], finish_reason="stop"))
    assert "no sampled token" in refused(reply([], [], finish_reason="length"))


def test_exactly_max_tokens_is_kept_and_one_more_is_refused():
    assert len(parse(reply([1] * 4, [-1.0] * 4), max_tokens=4).token_ids) == 4
    assert "5 sampled tokens for max_tokens 4" in refused(reply([1] * 5, [-1.0] * 5), max_tokens=4)


def test_a_generation_that_fills_the_context_is_kept_and_one_past_it_is_refused():
    assert len(parse(reply([1] * 6, [-1.0] * 6), max_tokens=None, prompt_tokens=10, max_model_len=16).token_ids) == 6
    message = refused(reply([1] * 7, [-1.0] * 7), max_tokens=None, prompt_tokens=10, max_model_len=16)
    assert "7 sampled tokens after a 10-token prompt" in message and "context of 16" in message


def test_the_reported_reply_is_refused():
    """40,001 sampled tokens for max_tokens 10,052 in a 32,768-token context (what fault injection found recorded)."""
    message = refused(reply([1] * 40_001, [-1.0] * 40_001), max_tokens=10_052, prompt_tokens=22_716,
                      max_model_len=32_768)
    assert "40001 sampled tokens for max_tokens 10052" in message


@pytest.mark.parametrize("logprobs", [[-0.5], [-0.5, -0.5, -0.5]], ids=["fewer", "more"])
def test_a_logprob_count_other_than_the_token_count_is_refused(logprobs):
    assert "2 token ids but" in refused(reply([1, 2], logprobs))
