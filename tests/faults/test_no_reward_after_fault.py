"""Invariant 5 of DESIGN.md, from the driver's side: a rollout whose last chat call failed upstream cannot be
given a reward, through the admin API or the Python API, unless the driver says why the failures do not matter."""

from __future__ import annotations

import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import chat, finish, rollout_status
from tests.faults.conftest import gate_config
from tests.faults.scenario import GOOD_TEXT, assert_only_good_turns, conversation, request
from tests.faults.upstream import Reply, Status

WHY = "the grader checks the files the agent wrote, not its chat"


async def fail_a_turn(http, handle, upstream, *, turn: str):
    """One good turn (for `later_turn`), then a turn the upstream keeps answering 503; the good calls."""
    messages = await conversation(http, handle, upstream, turn=turn, stream=False)
    good_calls = list(upstream.calls)
    upstream.then = Status(503)
    answer = await chat(http, handle.base_url, handle.secret, body=request(messages, False))
    assert answer.status == 503, answer.raw
    return good_calls


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("how", ["python", "http_status_ok"])
async def test_a_reward_after_a_failed_turn_is_refused(how, turn, upstream, tiny_model_dir, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(gate_config(upstream.url, tiny_model_dir, record_path)) as server:
        handle = server.open_rollout()
        good_calls = await fail_a_turn(http, handle, upstream, turn=turn)
        if how == "python":
            record = (await server.finish_rollout(handle.id, reward=1.0)).to_json_dict()
        else:
            code, record = await finish(http, server.url, handle.id, {"status": "ok", "reward": 1})
            assert code == 200, record
    assert record["status"] == "failed" and record["reward"] is None, record
    assert record["failure"]["cause"] == "upstream", record
    [on_disk] = read_records(record_path)
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"
    assert_only_good_turns(on_disk, good_calls)


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("how", ["python", "http"])
async def test_accepting_upstream_failures_keeps_the_reward(how, turn, upstream, tiny_model_dir, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(gate_config(upstream.url, tiny_model_dir, record_path)) as server:
        handle = server.open_rollout()
        good_calls = await fail_a_turn(http, handle, upstream, turn=turn)
        if how == "python":
            record = (await server.finish_rollout(handle.id, reward=1.0, accept_upstream_failures=WHY)).to_json_dict()
        else:
            code, record = await finish(
                http, server.url, handle.id, {"reward": 1, "accept_upstream_failures": WHY}
            )
            assert code == 200, record
    assert record["status"] == "ok" and record["reward"] == 1.0, record
    [on_disk] = read_records(record_path)
    assert on_disk.status == "ok" and on_disk.reward == 1.0
    assert_only_good_turns(on_disk, good_calls)


async def test_a_rollout_that_recovers_from_a_failed_turn_can_be_rewarded(upstream, tiny_model_dir, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(gate_config(upstream.url, tiny_model_dir, record_path)) as server:
        handle = server.open_rollout()
        await fail_a_turn(http, handle, upstream, turn="first_turn")
        upstream.then = Reply("back again")
        answer = await chat(
            http, handle.base_url, handle.secret, body=request([{"role": "user", "content": "Still there?"}], False)
        )
        assert answer.status == 200 and answer.content == "back again", answer.raw
        code, status = await rollout_status(http, server.url, handle.id)
        assert code == 200, status
        assert status.get("upstream_failures", 0) >= 1, status
        assert status.get("trailing_upstream_failures") == 0 and status.get("failure") is None, status
        code, record = await finish(http, server.url, handle.id, {"reward": 1})
    assert code == 200 and record["status"] == "ok" and record["reward"] == 1.0, record
    [on_disk] = read_records(record_path)
    assert on_disk.status == "ok" and on_disk.reward == 1.0
    assert [s.completion_tokens for s in on_disk.samples] == [len(upstream.calls[-1].token_ids)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_turn_the_server_fails_on_keeps_the_rollout_from_a_reward_even_after_good_turns(
    stream, upstream, tiny_model_dir, tmp_path, http
):
    """A defect inside the server (here: its renderer gone mid-run) answers a 500; the agent goes on and its later
    turns succeed, but what the server recorded around the broken turn cannot be trusted: the rollout is finished
    `failed` with cause `server` whatever the driver asks, and accepting upstream failures does not change that."""
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(gate_config(upstream.url, tiny_model_dir, record_path)) as server:
        handle = server.open_rollout()
        messages = await conversation(http, handle, upstream, turn="later_turn", stream=stream)
        renderer, server.policy.renderer = server.policy.renderer, None  # the defect
        broken = await chat(http, handle.base_url, handle.secret, body=request(messages, stream))
        server.policy.renderer = renderer
        assert broken.status == 500, broken.raw
        upstream.then = Reply(text=GOOD_TEXT)
        again = await chat(http, handle.base_url, handle.secret, body=request(messages, stream))
        assert again.status == 200, again.raw
        record = (await server.finish_rollout(handle.id, reward=1.0, accept_upstream_failures=WHY)).to_json_dict()
    assert record["status"] == "failed" and record["reward"] is None, record
    assert record["failure"]["cause"] == "server" and "AttributeError" in record["failure"]["message"], record
    [on_disk] = read_records(record_path)
    assert on_disk.failure.cause == "server" and on_disk.reward is None
