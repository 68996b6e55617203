"""Every way the policy server can fail, on a first turn and on a later one, streamed and not.

For each case the agent (raw HTTP, so the exact status is visible) makes one good turn or none, then a turn
during which the upstream fails in one way, persistently. The case checks:

(a) what the agent sees: 503 `upstream_unavailable` for an upstream that is unreachable, drops the connection or
    keeps answering 5xx/408/409/429; 504 `upstream_timeout` for a stall; 502 `bad_gateway` for a reply that
    breaks vLLM's contract or another 4xx; always OpenAI's error shape. A stream whose failure is known within
    `stream_hold_s` gets the same status; one that fails later gets 200, keepalives, an `error` event, `[DONE]`;
(b) the failure on the rollout's admin status (`upstream_failures`, `trailing_upstream_failures`, `failure`);
(c) that the driver's reward is refused: finishing with `{"reward": 1}` records `failed`, cause `upstream`;
(d) the record on disk: the same, with the good turn's sample exactly as the upstream sampled it, nothing more.

Control cases (a slow but good reply, a transient fault retried away, a valid body with the wrong content type)
show the other side: 200, no failure, and the reward is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import Answer, chat, finish, rollout_status
from tests.faults.conftest import gate_config
from tests.faults.scenario import assert_only_good_turns, assert_openai_error, conversation, request
from tests.faults.upstream import Behaviour, Body, Drop, Mangled, Reply, Stall, Status
from tests.invariants import assert_token_exact

RECOVERED_TEXT = "fine after all"
LATE_S = 1.0  # past the 0.5 s stream hold, and long enough for at least one 0.2 s keepalive
STALL_1S = {"request_timeout_s": 1.0, "attempts": 1}  # one try: whether a timeout is retried is not at stake
CUT_JSON = b'{"id": "cmpl-1", "choices": [{"token_ids": [1, 2'
VOCAB_SIZE = 640  # the tiny model's config.json vocab_size (its tokenizer has 603 entries)

UNAVAILABLE = {"status": 503, "code": "upstream_unavailable"}
TIMEOUT = {"status": 504, "code": "upstream_timeout"}
BAD_GATEWAY = {"status": 502, "code": "bad_gateway"}
RECOVERS = {"status": 200, "code": None}


@dataclass(frozen=True)
class Case:
    kind: str
    then: Behaviour | None  # what every upstream call gets once the fault starts; None: the upstream stops listening
    status: int  # what the agent sees (200: the turn succeeds after all)
    code: str | None  # the OpenAI error code the agent sees
    first: tuple[Behaviour, ...] = ()  # scripted ahead of `then` (a late first attempt, faults that clear up)
    late: bool = False  # the outcome is known only after the stream hold: a stream has sent 200 and keepalives
    upstream: dict = field(default_factory=dict)  # UpstreamConfig overrides
    server: dict = field(default_factory=dict)  # ServerConfig overrides

    async def inject(self, upstream) -> None:
        """Start the fault: the scripted first behaviours, then `then` for every call (or no listener at all)."""
        upstream.script(*self.first)
        if self.then is None:
            await upstream.refuse_connections()
        else:
            upstream.then = self.then


def _choice(edit) -> Mangled:
    """A good reply whose first choice is changed by `edit` (which changes the dict in place)."""

    def apply(body: dict) -> dict:
        edit(body["choices"][0])
        return body

    return Mangled(apply)


def _token_ids(change) -> Mangled:
    return _choice(lambda c: c.update(token_ids=change(c["token_ids"])))


def _logprobs(change) -> Mangled:
    return _choice(lambda c: c["logprobs"].update(token_logprobs=change(c["logprobs"]["token_logprobs"])))


def _sampled(count: int) -> Mangled:
    """A good reply whose sampled tokens are its first one `count` times over, each with a logprob."""

    def resample(choice: dict) -> None:
        choice["token_ids"] = choice["token_ids"][:1] * count
        choice["logprobs"]["token_logprobs"] = [-0.5] * count

    return _choice(resample)


def _first(value):
    return lambda values: [value, *values[1:]]


CASES = [
    # --- error statuses that persist through every retry
    Case("http_500", Status(500), **UNAVAILABLE),
    Case("http_502", Status(502), **UNAVAILABLE),
    Case("http_503", Status(503), **UNAVAILABLE),
    Case("http_504", Status(504), **UNAVAILABLE),
    Case("http_429_retry_after", Status(429, "slow down", headers=(("Retry-After", "0"),)), **UNAVAILABLE),
    Case("http_408", Status(408), **UNAVAILABLE),
    Case("http_409", Status(409), **UNAVAILABLE),
    Case("http_400_not_context", Status(400, "top_k must be -1 or at least 1"), **BAD_GATEWAY),
    Case("http_401", Status(401, "invalid api key"), **BAD_GATEWAY),
    Case("http_404", Status(404, "The model `faulty` does not exist."), **BAD_GATEWAY),
    Case("http_422", Status(422, "unprocessable"), **BAD_GATEWAY),
    # --- the connection: refused, reset or closed before any byte, after the headers, in the middle of the body
    Case("connection_refused", None, **UNAVAILABLE),
    Case("reset_on_arrival", Drop("arrival"), **UNAVAILABLE),
    Case("close_on_arrival", Drop("arrival", hard=False), **UNAVAILABLE),
    Case("reset_after_headers", Drop("headers"), **UNAVAILABLE),
    Case("close_after_headers", Drop("headers", hard=False), **UNAVAILABLE),
    Case("reset_mid_body", Drop("body"), **UNAVAILABLE),
    Case("close_mid_body", Drop("body", hard=False), **UNAVAILABLE),
    # --- no answer: within the stream hold (2 s > the 1 s timeout, so a stream gets the 504 too), and past it
    Case("stall", Stall(), **TIMEOUT, upstream=STALL_1S, server={"stream_hold_s": 2.0}),
    Case("stall_past_hold", Stall(), **TIMEOUT, late=True, upstream=STALL_1S),
    # --- failures that come after the stream hold: a stream has already answered 200
    Case("late_503", Status(503), first=(Status(503, delay_s=LATE_S),), late=True, **UNAVAILABLE),
    Case("late_reset_mid_body", Drop("body"), first=(Drop("body", delay_s=LATE_S),), late=True, **UNAVAILABLE),
    Case("late_invalid_json", Body(CUT_JSON), first=(Body(CUT_JSON, delay_s=LATE_S),), late=True, **BAD_GATEWAY),
    # --- a 200 whose body breaks vLLM's contract
    Case("invalid_json", Body(CUT_JSON), **BAD_GATEWAY),
    Case("empty_body", Body(b""), **BAD_GATEWAY),
    Case("json_not_object", Body(b"[1, 2, 3]"), **BAD_GATEWAY),
    Case("choices_missing", Mangled(lambda body: {"id": body["id"], "object": "text_completion"}), **BAD_GATEWAY),
    Case("choices_empty", Mangled(lambda body: {**body, "choices": []}), **BAD_GATEWAY),
    Case("token_ids_missing", _choice(lambda c: c.pop("token_ids")), **BAD_GATEWAY),
    Case("token_ids_string", _token_ids(lambda ids: " ".join(map(str, ids))), **BAD_GATEWAY),
    Case("token_ids_floats", _token_ids(lambda ids: [float(i) for i in ids]), **BAD_GATEWAY),
    Case("token_ids_booleans", _token_ids(lambda ids: [True for _ in ids]), **BAD_GATEWAY),
    Case("token_id_negative", _token_ids(_first(-1)), **BAD_GATEWAY),
    Case("token_id_vocab_size", _token_ids(_first(VOCAB_SIZE)), **BAD_GATEWAY),
    Case("token_id_past_int32", _token_ids(_first(2**31)), **BAD_GATEWAY),
    Case("token_id_2_pow_40", _token_ids(_first(2**40)), **BAD_GATEWAY),
    Case("logprobs_missing", _choice(lambda c: c.update(logprobs=None)), **BAD_GATEWAY),
    Case("logprobs_strings", _logprobs(lambda lps: [str(lp) for lp in lps]), **BAD_GATEWAY),
    Case("logprob_nan", _logprobs(_first(math.nan)), **BAD_GATEWAY),
    Case("logprob_infinity", _logprobs(_first(-math.inf)), **BAD_GATEWAY),
    Case("logprob_none", _logprobs(_first(None)), **BAD_GATEWAY),
    Case("lengths_differ", _logprobs(lambda lps: lps[:-1]), **BAD_GATEWAY),
    Case("finish_reason_unknown", _choice(lambda c: c.update(finish_reason="exploded")), **BAD_GATEWAY),
    Case("finish_reason_missing", _choice(lambda c: c.pop("finish_reason")), **BAD_GATEWAY),
    # --- a 200 no policy could have sampled: the upstream's fault, never a recorded turn
    Case("logprob_positive", _logprobs(lambda lps: [5.0, 0.25, *lps[2:]]), **BAD_GATEWAY),
    Case("too_many_tokens", _sampled(40_001), **BAD_GATEWAY),  # past max_tokens (2048 or 64) and the 4096 context
    Case("empty_generation", _sampled(0), **BAD_GATEWAY),
    Case("more_logprobs_than_tokens", _logprobs(lambda lps: [*lps, -0.5]), **BAD_GATEWAY),
    # --- controls: the turn succeeds, nothing is a failure, the reward counts
    Case("slow_reply_after_hold", Reply(RECOVERED_TEXT, delay_s=LATE_S), late=True, **RECOVERS),
    Case("wrong_content_type", Reply(RECOVERED_TEXT, content_type="text/plain"), **RECOVERS),
    Case("transient_503", Reply(RECOVERED_TEXT), first=(Status(503), Status(503)), **RECOVERS),
    Case("transient_reset", Reply(RECOVERED_TEXT), first=(Drop("arrival"),), **RECOVERS),
]


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.kind)
async def test_fault(case: Case, stream: bool, turn: str, upstream, tiny_model_dir, tmp_path, http, record_property):
    record_path = tmp_path / "rollouts.jsonl"
    config = gate_config(upstream.url, tiny_model_dir, record_path, upstream=case.upstream, **case.server)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        messages = await conversation(http, handle, upstream, turn=turn, stream=stream)
        good_calls = list(upstream.calls)

        await case.inject(upstream)
        before = upstream.attempts
        answer = await chat(http, handle.base_url, handle.secret, body=request(messages, stream))
        spent = upstream.attempts - before
        status_http, status = await rollout_status(http, server.url, handle.id)
        finish_http, finished = await finish(http, server.url, handle.id, {"reward": 1})
    record_property("seen", describe(answer))
    record_property("finished", describe_record(finish_http, finished))
    record_property("upstream_calls", spent)

    assert_agent_saw(answer, case, stream)
    assert status_http == 200 and finish_http == 200, (status, finished)
    assert spent <= config.upstream.attempts, f"the turn cost {spent} upstream calls"
    [on_disk] = read_records(record_path)
    assert on_disk.rollout_id == handle.id
    if case.status == 200:
        assert status.get("trailing_upstream_failures") == 0 and status.get("failure") is None, status
        assert finished["status"] == "ok" and finished["reward"] == 1.0, finished
        assert on_disk.status == "ok" and on_disk.reward == 1.0 and on_disk.failure is None
        assert_token_exact(on_disk, upstream.calls)
        assert sum(len(s.turns) for s in on_disk.samples) == len(good_calls) + 1
        return
    assert status.get("upstream_failures", 0) >= 1 and status.get("trailing_upstream_failures", 0) >= 1, status
    assert (status.get("failure") or {}).get("cause") == "upstream", status
    assert isinstance(status["failure"]["message"], str), status
    assert finished["status"] == "failed" and finished["reward"] is None, finished
    assert finished["failure"]["cause"] == "upstream", finished
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"
    assert_only_good_turns(on_disk, good_calls)


def describe_record(status: int, record: dict | str) -> str:
    """How the rollout was finished, in a few words: its status and failure cause, or the HTTP error."""
    if status != 200 or not isinstance(record, dict):
        return f"finish answered {status}"
    return f"{record['status']} ({(record.get('failure') or {}).get('cause')}), reward {record['reward']}"


def describe(answer: Answer) -> str:
    """What the agent saw, in a few words: the status, and the error code of the body or of a stream's event."""
    try:
        error = answer.error
    except ValueError:
        return f"{answer.status} (not JSON)"
    broken = ", connection broken" if answer.broken else ""
    if answer.content_type == "text/event-stream":
        code = error["code"] if error else None
        return f"{answer.status} stream, error event {code}, {answer.keepalives} keepalives{broken}"
    return f"{answer.status} {error.get('code') if error else None}{broken}"


def assert_agent_saw(answer: Answer, case: Case, stream: bool) -> None:
    shown = answer.raw[:600]
    assert answer.broken is None, f"the agent's connection broke: {answer.broken}; it had {shown!r}"
    if case.status == 200:
        assert answer.status == 200, shown
        assert answer.content == RECOVERED_TEXT, shown
        if stream:
            assert answer.data[-1] == "[DONE]", shown
            if case.late:
                assert answer.keepalives >= 1, shown
        return
    if stream and case.late:
        assert answer.status == 200 and answer.content_type == "text/event-stream", shown
        assert answer.keepalives >= 1, shown
        assert_openai_error(answer, case.code)
        assert answer.data[-1] == "[DONE]", shown
        assert answer.content is None and answer.finish_reason is None, shown
        return
    assert answer.status == case.status, shown
    assert_openai_error(answer, case.code)
    if answer.status == 503:
        assert answer.headers.get("Retry-After"), answer.headers
