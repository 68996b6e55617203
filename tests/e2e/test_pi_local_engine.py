"""The embedded default end to end: real Pi, the interception server and the local engine serving the tiny model
trained to call tools. Pi runs the tool call the model sampled (`answer N` through its bash tool), sends the result
back, the host grades, and the trajectory holds the tool loop as one token-exact sample."""

from __future__ import annotations

import math

import pytest

from agents import PiAgent
from agents.runner import Runner, RunnerConfig
from agents.specs.packages import PI
from agents.tasks import load_tasks
from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import require_agent
from tests.e2e.test_token_exact_real_policy import prompt_logprobs
from trainer.engine import EngineConfig, LocalEngine

pytestmark = pytest.mark.e2e


async def test_pi_runs_the_tool_the_local_model_called_and_is_graded(tool_model_dir, tmp_path):
    binary = require_agent(PI)  # skips without the pinned Pi; fails under CI
    tasks = [t for t in load_tasks("examples/tasks/arithmetic.jsonl") if t.grader.kind == "answer"]
    async with LocalEngine(EngineConfig(model=tool_model_dir, port=0, served_model_name="policy")) as engine:
        config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=tool_model_dir,
                              record_path=tmp_path / "rollouts.jsonl")
        async with InterceptionServer(config) as server:
            runner = Runner(server, RunnerConfig(agent=PiAgent(binary=binary, max_tokens=96),
                                                 sampling=SamplingSettings(temperature=0.0), concurrency=2))
            records = await runner.run_tasks(tasks, n=1)
            assert all(r.status == "ok" for r in records), [r.failure for r in records]
            assert sum(r.reward for r in records) >= 2, [(r.answer, r.reward) for r in records]
            looped = [r for r in records if any(len(s.turns) >= 2 for s in r.samples)]
            assert looped, "Pi ran a tool call and sent its result back"
            sample = next(s for s in looped[0].samples if len(s.turns) >= 2)
            scored = await prompt_logprobs(engine.base_url, "policy", sample.input_ids)
            for position, mask in enumerate(sample.completion_mask):
                if mask:
                    assert math.isclose(scored[position], sample.old_logprobs[position], abs_tol=1e-4)
