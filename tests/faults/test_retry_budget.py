"""An agent that retries a failed turn (an SDK resending the same body) does not multiply the upstream calls:
`UpstreamConfig.attempts` is what one turn may cost in all, across the agent's own retries of it."""

from __future__ import annotations

import openai
import orjson
import pytest

from interceptor import InterceptionServer
from tests.faults.agent import chat
from tests.faults.conftest import gate_config
from tests.faults.scenario import assert_openai_error, conversation, request
from tests.faults.upstream import Status


@pytest.mark.parametrize("turn", ["first_turn", "later_turn"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_agents_retries_of_a_failed_turn_share_its_upstream_budget(
    stream, turn, upstream, tiny_model_dir, tmp_path, http
):
    config = gate_config(upstream.url, tiny_model_dir, tmp_path / "rollouts.jsonl")
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        messages = await conversation(http, handle, upstream, turn=turn, stream=stream)
        upstream.then = Status(503)
        body = orjson.dumps(request(messages, stream))
        before = upstream.attempts
        spent = []
        for retry in range(3):
            headers = {"X-Stainless-Retry-Count": str(retry)} if retry else {}
            answer = await chat(http, handle.base_url, handle.secret, raw=body, headers=headers)
            assert answer.status == 503, answer.raw
            assert_openai_error(answer, "upstream_unavailable")
            spent.append(upstream.attempts - before)
    budget = config.upstream.attempts
    assert 1 <= spent[-1] <= budget, f"upstream calls after each of 3 tries: {spent}; the budget is {budget}"


async def test_openai_sdk_retries_do_not_multiply_upstream_calls(upstream, tiny_model_dir, tmp_path, http):
    config = gate_config(upstream.url, tiny_model_dir, tmp_path / "rollouts.jsonl")
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        upstream.then = Status(503)
        client = openai.AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret, max_retries=2)
        with pytest.raises(openai.APIStatusError) as raised:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        await client.close()
    assert raised.value.status_code == 503
    budget = config.upstream.attempts
    assert 1 <= upstream.attempts <= budget, f"{upstream.attempts} upstream calls; the budget is {budget}"
