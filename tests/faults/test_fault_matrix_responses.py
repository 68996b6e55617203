"""The fault matrix (test_fault_matrix.py's cases) through the OpenAI Responses dialect, the way Codex CLI sees
the faults.

Errors before the headers are OpenAI's error shape with chat's statuses and codes (503 `upstream_unavailable`, 504
`upstream_timeout`, 502 `bad_gateway`); a stream that fails after the hold has sent `response.created` and
keepalive comments, then `response.failed` carrying the code, and no `response.completed`. What holds for every
dialect is checked the same way: the failure on the rollout, the refused reward, a record with the good turn only.
"""

from __future__ import annotations

import orjson
import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import Answer, chat, finish, rollout_status
from tests.faults.conftest import gate_config
from tests.faults.scenario import GOOD_TEXT, assert_only_good_turns, assert_openai_error
from tests.faults.test_fault_matrix import CASES, RECOVERED_TEXT, Case
from tests.faults.upstream import Reply
from tests.invariants import assert_token_exact

QUESTION = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is six times seven?"}]}
FOLLOW_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Are you sure?"}]}


def request(items: list[dict], stream: bool) -> dict:
    return {"model": "policy", "input": items, "stream": stream, "store": False}


def text_of(answer: Answer) -> str:
    if answer.content_type.startswith("text/event-stream"):
        return "".join(data["delta"] for name, data in answer.named_events if name == "response.output_text.delta")
    output = orjson.loads(answer.raw)["output"]
    return "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])


async def responses_call(http, handle, items: list[dict], stream: bool) -> Answer:
    return await chat(http, handle.base_url, handle.secret, body=request(items, stream), path="/responses")


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.kind)
async def test_fault(case: Case, stream: bool, turn: str, upstream, tiny_model_dir, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    config = gate_config(upstream.url, tiny_model_dir, record_path, upstream=case.upstream, **case.server)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        items = [QUESTION]
        if turn == "later_turn":
            upstream.script(Reply(GOOD_TEXT))
            good = await responses_call(http, handle, items, stream)
            assert good.status == 200 and text_of(good) == GOOD_TEXT, good.raw
            items += [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": GOOD_TEXT}]}, FOLLOW_UP]  # fmt: skip
        good_calls = list(upstream.calls)

        await case.inject(upstream)
        answer = await responses_call(http, handle, items, stream)
        status_http, status = await rollout_status(http, server.url, handle.id)
        finish_http, finished = await finish(http, server.url, handle.id, {"reward": 1})

    shown = answer.raw[:600]
    assert answer.broken is None, f"the connection broke: {answer.broken}; it had {shown!r}"
    assert status_http == 200 and finish_http == 200, (status, finished)
    [on_disk] = read_records(record_path)
    if case.status == 200:
        assert answer.status == 200 and text_of(answer) == RECOVERED_TEXT, shown
        if stream:
            assert answer.named_events[-1][0] == "response.completed", shown
        assert finished["status"] == "ok" and finished["reward"] == 1.0, finished
        assert on_disk.status == "ok" and on_disk.failure is None
        assert_token_exact(on_disk, upstream.calls)
        return
    if stream and case.late:
        names = [name for name, _ in answer.named_events]
        assert answer.status == 200 and names[0] == "response.created" and answer.keepalives >= 1, shown
        assert names[-1] == "response.failed" and "response.completed" not in names, shown
        failed = answer.named_events[-1][1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == case.code, shown
    else:
        assert answer.status == case.status, shown
        assert_openai_error(answer, case.code)
    assert (status.get("failure") or {}).get("cause") == "upstream", status
    assert finished["status"] == "failed" and finished["reward"] is None, finished
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"
    assert_only_good_turns(on_disk, good_calls)
