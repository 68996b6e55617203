"""Harbor as the driver on the embedded default: real Harbor runs Pi trials of the example tasks
(its Docker environment, its agents, its verifier) whose model is the local engine serving the tiny tool-calling
policy through the interception server. Every trial is graded by Harbor's verifier, and every sample the trials left
holds the engine's own logprob for each token it sampled (rescored by the engine)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agents.harbor.driver import HarborConfig, HarborDriver
from agents.runner import Runner, RunnerConfig
from agents.sources import load_tasks
from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig
from tests.agents.test_harbor_driver import harbor
from tests.e2e.test_token_exact_real_policy import prompt_logprobs
from trainer.engine import EngineConfig, LocalEngine

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


@harbor
# Pi only in the suite: Claude Code's trials pass here too, in 115 s (its prompt is ~15k tokens, rescored per sample)
@pytest.mark.parametrize("agent", ["pi"])
async def test_harbor_trials_on_the_embedded_default_are_graded_by_the_verifier_and_token_exact(agent, tool_model_dir,
                                                                                                 tmp_path):
    tasks = load_tasks(EXAMPLES, harbor_runs=True)
    async with LocalEngine(EngineConfig(model=tool_model_dir, port=0, served_model_name="policy")) as engine:
        config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=tool_model_dir,
                              record_path=tmp_path / "rollouts.jsonl")  # fmt: skip
        async with InterceptionServer(config) as server:
            driver = HarborDriver(HarborConfig(agent=agent, trials_dir=tmp_path / "trials"))
            driver.check(server, tasks)
            runner = Runner(server, RunnerConfig(driver=driver, sampling=SamplingSettings(temperature=0.0, max_tokens=96),
                                                 concurrency=2))  # fmt: skip
            records = await runner.run_tasks(tasks, n=1)
            assert all(r.status == "ok" and r.reward in (0.0, 1.0) for r in records), [r.failure for r in records]
            samples = [s for r in records for s in r.samples]
            assert samples, "the agents spoke to the policy"
            for sample in samples:
                scored = await prompt_logprobs(engine.base_url, "policy", sample.input_ids)
                for position, mask in enumerate(sample.completion_mask):
                    if mask:
                        assert math.isclose(scored[position], sample.old_logprobs[position], abs_tol=1e-4)
