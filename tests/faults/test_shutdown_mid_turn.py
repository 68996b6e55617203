"""The interception server shuts down while a turn waits on a slow upstream: the agent gets no normal answer
(a 503, an error event, or a closed connection), and the rollout is on disk as `interrupted`, never rewarded,
with the turns it had finished intact."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import pytest

from interceptor import InterceptionServer, read_records
from tests.faults.agent import chat
from tests.faults.conftest import SERVER_DEFAULTS, gate_config
from tests.faults.scenario import assert_only_good_turns, conversation, request
from tests.faults.upstream import Reply

TOO_LATE = "an answer nobody will see"


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_shutdown_mid_turn_records_the_rollout_as_interrupted(
    stream, turn, upstream, tiny_model_dir, tmp_path, http
):
    record_path = tmp_path / "rollouts.jsonl"
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            InterceptionServer(gate_config(upstream.url, tiny_model_dir, record_path))
        )
        handle = server.open_rollout()
        messages = await conversation(http, handle, upstream, turn=turn, stream=stream)
        good_calls = list(upstream.calls)
        upstream.then = Reply(TOO_LATE, delay_s=60.0)
        upstream.arrived.clear()
        agent = asyncio.create_task(chat(http, handle.base_url, handle.secret, body=request(messages, stream)))
        await asyncio.wait_for(upstream.arrived.wait(), 5.0)
        if stream:  # past the hold: the stream has answered 200 and sends keepalives
            await asyncio.sleep(SERVER_DEFAULTS["stream_hold_s"] + 0.3)
        shutdown_started = asyncio.get_running_loop().time()
        await asyncio.wait_for(stack.aclose(), 10.0)  # the server's __aexit__, mid-turn
        shutdown_s = asyncio.get_running_loop().time() - shutdown_started

    try:
        answer = await asyncio.wait_for(agent, 5.0)
    except aiohttp.ClientError:
        answer = None  # the connection was closed: acceptable
    if answer is not None:
        assert TOO_LATE.encode() not in answer.raw, answer.raw
        if answer.status == 200:
            assert answer.finish_reason is None, answer.raw  # an error event or a cut stream, not an answer
        else:
            assert answer.status == 503, answer.raw
    assert shutdown_s < SERVER_DEFAULTS["shutdown_grace_s"] + 3.0, f"shutdown took {shutdown_s:.1f}s"

    [on_disk] = [r for r in read_records(record_path) if r.rollout_id == handle.id]
    assert on_disk.status == "interrupted", on_disk.status
    assert on_disk.failure is not None and on_disk.failure.cause == "interrupted", on_disk.failure
    assert on_disk.reward is None
    assert_only_good_turns(on_disk, good_calls)
