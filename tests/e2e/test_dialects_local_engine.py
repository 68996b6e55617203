"""Claude Code and Codex CLI against the interception server in front of the local engine (real generation, real
prompts of 6k and 12k tokens): what the Messages and Responses dialects render is what the policy conditioned on.

Every sampled token of every recorded sample must carry the logprob the engine gives it when it scores the
recorded sequence afresh (`prompt_logprobs`), to 1e-4. The embedded default policy is trained on Pi's and
OpenCode's tool shape, not on these agents' (`Bash`, `exec_command`), so the rollouts are not expected to earn a
reward; they are expected to run, be recorded, and be token-exact.
"""

from __future__ import annotations

import math

import pytest

from agents.claude import ClaudeAgent
from agents.codex import CodexAgent
from agents.packages import CLAUDE, CODEX
from agents.runner import Runner, RunnerConfig
from agents.tasks import load_tasks
from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import require_agent
from tests.e2e.test_pi_local_engine import tool_model_dir  # noqa: F401  (a session fixture: the embedded default)
from tests.e2e.test_token_exact_real_policy import prompt_logprobs
from trainer.engine import EngineConfig, LocalEngine

pytestmark = pytest.mark.e2e


def claude_spec() -> ClaudeAgent:
    return ClaudeAgent(binary=require_agent(CLAUDE), max_output_tokens=96)


def codex_spec() -> CodexAgent:
    return CodexAgent(binary=require_agent(CODEX))


@pytest.mark.parametrize("make_spec", [claude_spec, codex_spec], ids=["claude", "codex"])
async def test_the_agents_samples_are_what_the_local_engine_sampled(make_spec, tool_model_dir, tmp_path):  # noqa: F811
    spec = make_spec()  # skips without the pinned agent; fails under CI
    [task] = [t for t in load_tasks("examples/tasks/arithmetic.jsonl") if t.id == "submit-42"]
    async with LocalEngine(EngineConfig(model=tool_model_dir, port=0, served_model_name="policy")) as engine:
        config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=tool_model_dir,
                              record_path=tmp_path / "rollouts.jsonl")
        async with InterceptionServer(config) as server:
            runner = Runner(server, RunnerConfig(agent=spec, sampling=SamplingSettings(temperature=1.0, seed=7,
                                                                                       max_tokens=96)))
            [record] = await runner.run_tasks([task], n=1)
            assert record.samples, (record.status, record.failure)
            checked = 0
            for sample in record.samples:
                scored = await prompt_logprobs(engine.base_url, "policy", sample.input_ids)
                for position, mask in enumerate(sample.completion_mask):
                    if mask:
                        assert math.isclose(scored[position], sample.old_logprobs[position], abs_tol=1e-4)
                        checked += 1
    assert checked >= 1
    assert max(len(sample.input_ids) for sample in record.samples) > 4000  # the agent's real prompt
