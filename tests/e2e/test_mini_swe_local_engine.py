"""mini-swe-agent end to end on the embedded default: the real agent (PyPI), the interception server and the local
engine serving the tiny tool-calling model. mini runs the `answer N` the model sampled through its bash tool, the
host grades, and every sample in the record (the tool loop, and the forks mini's dropped replies make) holds the
engine's own logprobs for the tokens it sampled.

The embedded model was not trained inside mini's prompt (its training draws Pi's, OpenCode's, Claude Code's and
Codex's requests), where it copies the task's number less reliably: the bar is one graded answer, not all."""

from __future__ import annotations

import math

import pytest

from agents.runner import Runner, RunnerConfig
from agents.specs.mini_swe import MiniSweAgent
from agents.specs.packages import MINI_SWE
from agents.tasks import load_tasks
from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import require_agent
from tests.e2e.test_token_exact_real_policy import prompt_logprobs
from trainer.engine import EngineConfig, LocalEngine

pytestmark = pytest.mark.e2e


async def test_mini_runs_the_tool_the_local_model_called_is_graded_and_every_sample_is_token_exact(tool_model_dir,
                                                                                                    tmp_path):
    binary = require_agent(MINI_SWE)  # skips without the pinned install; fails under CI
    tasks = [t for t in load_tasks("examples/tasks/arithmetic.jsonl") if t.grader.kind == "answer"]
    async with LocalEngine(EngineConfig(model=tool_model_dir, port=0, served_model_name="policy")) as engine:
        config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=tool_model_dir,
                              record_path=tmp_path / "rollouts.jsonl")
        async with InterceptionServer(config) as server:
            # mini goes on after `answer` until the model says it is done, which the tiny model never does: without a
            # step limit each rollout ran 76-87 turns (until three replies in a row had no tool call), and rescoring
            # their 480k tokens took over 20 minutes of a CI run. 8 calls hold a submitted answer, a tool loop and
            # the forks of dropped replies.
            agent = MiniSweAgent(binary=binary, max_tokens=96, step_limit=8)
            runner = Runner(server, RunnerConfig(agent=agent,
                                                 sampling=SamplingSettings(temperature=0.0), concurrency=2))
            records = await runner.run_tasks(tasks, n=1)
            assert all(r.status == "ok" for r in records), [r.failure for r in records]
            assert sum(r.reward for r in records) >= 1, [(r.answer, r.reward) for r in records]
            looped = [s for r in records for s in r.samples if len(s.turns) >= 2]
            assert looped, "mini ran a tool call and sent its result back"
            for sample in (s for r in records for s in r.samples):
                scored = await prompt_logprobs(engine.base_url, "policy", sample.input_ids)
                for position, mask in enumerate(sample.completion_mask):
                    if mask:
                        assert math.isclose(scored[position], sample.old_logprobs[position], abs_tol=1e-4)
