"""Two real training steps of TRL's AsyncGRPOTrainer on CPU, fed by the rollout worker with real agent rollouts
(an OpenAI-SDK program) through the interception server and the local engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
    lines = [json.loads(line) for line in (config.out / "metrics.jsonl").read_text().splitlines()]
    assert sum("step" in line for line in lines) >= 2
    gaps = [line["logprob_gap/mean"] for line in lines if "logprob_gap/mean" in line]
    assert gaps and all(0 <= gap < 1 for gap in gaps)  # logged every step: fp32 trainer and engine
    setup = json.loads((config.out / "setup.json").read_text())
    assert setup["attention"] == "torch" and "no CUDA device" in setup["attention_reason"]
    assert setup["trainer_dtype"] == setup["generator_dtype"] == "float32" and setup["dtype_mismatch"] is None


async def test_a_generator_serving_another_dtype_is_refused_before_training(tiny_model_dir, tmp_path):
    from trainer.engine import EngineConfig, LocalEngine
    from trainer.precision import DtypeMismatch

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "instruction": "Say anything.", "grader": {"kind": "command",
                                                                                         "command": "true"}}) + "\n")
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, dtype="bfloat16")) as engine:
        config = TrainConfig(tasks=tasks, model=tiny_model_dir, upstream=engine.base_url, out=tmp_path / "run",
                             dtype="float32")
        with pytest.raises(DtypeMismatch, match="trainer holds the weights in float32 but the generator serves "
                                                "bfloat16.*--dtype float32"):
            await train(config)
    setup = json.loads((config.out / "setup.json").read_text())
    assert setup["generator_dtype"] == "bfloat16" and "bfloat16" in setup["dtype_mismatch"]


def test_nccl_weight_sync_needs_one_vllm_url(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    with pytest.raises(ValueError, match="upstream must be its URL"):
        TrainConfig(tasks=tasks, upstream="local", weight_sync="nccl")
    with pytest.raises(ValueError, match="upstream must be its URL"):
        TrainConfig(tasks=tasks, upstream="http://a:8000,http://b:8000", weight_sync="nccl")
    with pytest.raises(ValueError, match="weight_sync must be"):
        TrainConfig(tasks=tasks, weight_sync="gloo")


async def test_nccl_weight_sync_builds_trls_own_client(tiny_model_dir, tmp_path):
    """Without vLLM in the trainer's environment (this one), TRL's NCCL client refuses to be built: the run reached it."""
    from trainer.engine import EngineConfig, LocalEngine

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "instruction": "Say anything.", "grader": {"kind": "command",
                                                                                         "command": "true"}}) + "\n")
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0)) as engine:
        config = TrainConfig(tasks=tasks, model=tiny_model_dir, upstream=engine.base_url, out=tmp_path / "run",
                             weight_sync="nccl")
        with pytest.raises(ImportError, match="vLLM is required to use WeightTransferClient"):
            await train(config)


async def test_two_grpo_steps_on_the_real_smollm2_change_its_weights_through_a_real_agent(smollm2_dir, tmp_path):
    """The pretrained model (`make-model smollm2`) in the same loop: an OpenAI-SDK agent's rollouts through the gate
    and the local engine, two GRPO steps, the new weights synced to the engine each step. The trained weights differ
    from the imported ones, and the first step's samples, drawn with the weights the trainer then held, score the
    same in the trainer as in the engine (fp32 on both sides)."""
    from safetensors.torch import load_file

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({
        "id": "parity", "instruction": "Say anything.",
        "grader": {"kind": "python", "callable": "tests.trainer.parity_task:grade"},
        "limits": {"wall_s": 120, "idle_s": 60},
    }) + "\n")
    config = TrainConfig(tasks=tasks, model=smollm2_dir, agent="command",
                         command=f"{sys.executable} {Path(__file__).with_name('parity_task.py')}", out=tmp_path / "run",
                         max_tokens=8, num_generations=4, samples_per_step=4, max_steps=2, learning_rate=1e-4,
                         concurrency=4)
    result = await train(config)

    assert result.engine_weight_version >= 3 and result.samples
    trained = json.loads((config.out / "final" / "config.json").read_text())
    assert (trained["model_type"], trained["vocab_size"]) == ("llama", 49152)  # SmolLM2 itself, not a stand-in
    before, after = load_file(smollm2_dir / "model.safetensors"), load_file(config.out / "final" / "model.safetensors")
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before)
    lines = [json.loads(line) for line in (config.out / "metrics.jsonl").read_text().splitlines()]
    first = next(line for line in lines if "logprob_gap/mean" in line)
    assert first["logprob_gap/mean"] < 1e-3, first
