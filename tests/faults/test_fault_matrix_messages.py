"""The fault matrix (test_fault_matrix.py's cases) through the Anthropic Messages dialect: the same faults, seen the
way Claude Code and the anthropic SDKs see them.

What differs from chat is only the shape: an upstream that is unavailable is 529 `overloaded_error` (what
Anthropic's clients retry), a timeout 504 and a broken reply 502, both `api_error`, always in
`{"type": "error", "error": {"type", "message"}}`; a stream that fails after the hold has sent `message_start` and
`ping` events, then an `error` event and no `message_stop`. What holds for every dialect is checked the same way:
the failure on the rollout, the refused reward, and a record with the good turn only.
"""

from __future__ import annotations

import orjson
import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import Answer, chat, finish, rollout_status
from tests.faults.conftest import gate_config
from tests.faults.scenario import FIRST_MESSAGES, FOLLOW_UP, GOOD_TEXT, assert_only_good_turns
from tests.faults.test_fault_matrix import CASES, RECOVERED_TEXT, Case
from tests.faults.upstream import Reply
from tests.invariants import assert_token_exact

# The chat dialect's (status, code) -> what a Messages client sees.
EXPECTED = {
    (503, "upstream_unavailable"): (529, "overloaded_error"),
    (504, "upstream_timeout"): (504, "api_error"),
    (502, "bad_gateway"): (502, "api_error"),
}


def request(messages: list[dict], stream: bool) -> dict:
    return {"model": "policy", "max_tokens": 64, "messages": messages, "stream": stream}


def text_of(answer: Answer) -> str:
    if answer.content_type.startswith("text/event-stream"):
        return "".join(data["delta"].get("text", "") for name, data in answer.named_events if name == "content_block_delta")
    return "".join(block.get("text", "") for block in orjson.loads(answer.raw)["content"])


def error_of(answer: Answer) -> dict:
    if answer.content_type.startswith("text/event-stream"):
        [error] = [data for name, data in answer.named_events if name == "error"]
    else:
        error = orjson.loads(answer.raw)
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}, error
    assert isinstance(error["error"]["message"], str) and error["error"]["message"], error
    return error["error"]


async def messages_call(http, handle, messages: list[dict], stream: bool) -> Answer:
    return await chat(http, handle.base_url, handle.secret, body=request(messages, stream), path="/messages",
                      headers={"x-api-key": handle.secret})  # fmt: skip


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.kind)
async def test_fault(case: Case, stream: bool, turn: str, upstream, tiny_model_dir, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    config = gate_config(upstream.url, tiny_model_dir, record_path, upstream=case.upstream, **case.server)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        messages = list(FIRST_MESSAGES)
        if turn == "later_turn":
            upstream.script(Reply(GOOD_TEXT))
            good = await messages_call(http, handle, messages, stream)
            assert good.status == 200 and text_of(good) == GOOD_TEXT, good.raw
            messages += [{"role": "assistant", "content": [{"type": "text", "text": GOOD_TEXT}]}, FOLLOW_UP]
        good_calls = list(upstream.calls)

        await case.inject(upstream)
        answer = await messages_call(http, handle, messages, stream)
        status_http, status = await rollout_status(http, server.url, handle.id)
        finish_http, finished = await finish(http, server.url, handle.id, {"reward": 1})

    shown = answer.raw[:600]
    assert answer.broken is None, f"the connection broke: {answer.broken}; it had {shown!r}"
    assert status_http == 200 and finish_http == 200, (status, finished)
    [on_disk] = read_records(record_path)
    if case.status == 200:
        assert answer.status == 200 and text_of(answer) == RECOVERED_TEXT, shown
        if stream:
            assert answer.named_events[-1][0] == "message_stop", shown
        assert finished["status"] == "ok" and finished["reward"] == 1.0, finished
        assert on_disk.status == "ok" and on_disk.failure is None
        assert_token_exact(on_disk, upstream.calls)
        return
    expected_status, expected_type = EXPECTED[(case.status, case.code)]
    if stream and case.late:
        names = [name for name, _ in answer.named_events]
        assert answer.status == 200 and names[0] == "message_start" and "ping" in names, shown
        assert names[-1] == "error" and "message_stop" not in names, shown
    else:
        assert answer.status == expected_status, shown
    assert error_of(answer)["type"] == expected_type, shown
    assert (status.get("failure") or {}).get("cause") == "upstream", status
    assert finished["status"] == "failed" and finished["reward"] is None, finished
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"
    assert_only_good_turns(on_disk, good_calls)
