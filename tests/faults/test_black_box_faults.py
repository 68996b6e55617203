"""black_box mode relays the agent's chat calls to an OpenAI-style upstream: a rollout whose every call failed
there is finished `failed` (cause `upstream`) even when the driver passes a reward."""

from __future__ import annotations

import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import chat, finish
from tests.faults.conftest import black_box_config
from tests.faults.scenario import FIRST_MESSAGES, FOLLOW_UP, request
from tests.faults.upstream import Reply, Status

FAULTS = {
    # kind: (what every upstream call gets, the statuses the agent may see); None: the upstream stops listening
    "http_404": (Status(404, "The model `gpt-x` does not exist or you do not have access to it."), {404, 502}),
    "http_503": (Status(503), {503}),
    "connection_refused": (None, {503}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", sorted(FAULTS))
async def test_a_black_box_rollout_whose_every_call_failed_is_not_rewarded(kind, stream, upstream, tmp_path, http):
    behaviour, statuses = FAULTS[kind]
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(black_box_config(upstream.url, record_path)) as server:
        handle = server.open_rollout()
        if behaviour is None:
            await upstream.refuse_connections()
        else:
            upstream.then = behaviour
        for messages in (FIRST_MESSAGES, [*FIRST_MESSAGES, FOLLOW_UP]):
            answer = await chat(http, handle.base_url, handle.secret, body=request(messages, stream))
            assert answer.status in statuses, (answer.status, answer.raw[:300])
            assert answer.error is not None and "message" in answer.error, answer.raw[:300]
        code, record = await finish(http, server.url, handle.id, {"reward": 1})
    assert code == 200, record
    assert record["status"] == "failed" and record["reward"] is None, record
    assert record["failure"]["cause"] == "upstream", record
    [on_disk] = read_records(record_path)
    assert on_disk.status == "failed" and on_disk.reward is None and on_disk.failure.cause == "upstream"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_black_box_rollout_that_got_answers_keeps_its_reward(stream, upstream, tmp_path, http):
    record_path = tmp_path / "rollouts.jsonl"
    async with InterceptionServer(black_box_config(upstream.url, record_path)) as server:
        handle = server.open_rollout()
        upstream.then = Reply("relayed")
        answer = await chat(http, handle.base_url, handle.secret, body=request(FIRST_MESSAGES, stream))
        assert answer.status == 200 and answer.content == "relayed", answer.raw[:300]
        code, record = await finish(http, server.url, handle.id, {"reward": 1})
    assert code == 200 and record["status"] == "ok" and record["reward"] == 1.0, record
    [on_disk] = read_records(record_path)
    assert on_disk.status == "ok" and on_disk.reward == 1.0
