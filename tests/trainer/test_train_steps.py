"""Two real training steps of TRL's AsyncGRPOTrainer on CPU, fed by the rollout worker with real agent rollouts
(an OpenAI-SDK program) through the interception server and the local engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from interceptor import read_records
from trainer.train_main import TrainConfig, train


async def test_two_grpo_steps_on_cpu_update_the_served_policy(tiny_model_dir, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({
        "id": "parity",
        "instruction": "Say anything.",
        "grader": {"kind": "python", "callable": "tests.trainer.parity_task:grade"},
        "limits": {"wall_s": 60, "idle_s": 30},
    }) + "\n")
    agent = Path(__file__).with_name("parity_task.py")
    config = TrainConfig(
        tasks=tasks,
        model=tiny_model_dir,
        agent="command",
        command=f"{sys.executable} {agent}",
        out=tmp_path / "run",
        max_tokens=8,
        num_generations=4,
        samples_per_step=4,
        max_steps=2,
        learning_rate=1e-3,
        concurrency=4,
    )
    result = await train(config)

    assert result.engine_weight_version >= 3  # the cold sync and one per step reached the engine
    assert result.samples, "the trainer got samples from the worker"
    by_group: dict[int, list[float]] = {}
    for group_id, advantage, model_version in result.samples:
        assert model_version >= 1
        by_group.setdefault(group_id, []).append(advantage)
    for advantages in by_group.values():
        assert abs(sum(advantages)) < 1e-4  # one sample per rollout here: group-relative advantages sum to 0
    records = list(read_records(config.out / "rollouts.jsonl"))
    versions = {t.policy_version for r in records for s in r.samples for t in s.turns}
    # Which turns saw new weights depends on the machine's speed (a fast one generates every group before the
    # first sync); what holds everywhere: every turn is stamped with a version the engine really served.
    assert versions and all(1 <= v <= result.engine_weight_version for v in versions), versions
    assert (config.out / "metrics.jsonl").read_text().count('"step"') >= 2
