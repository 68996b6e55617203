"""Two real training steps of TRL's AsyncGRPOTrainer on CPU, fed by the rollout worker with real agent rollouts
(an OpenAI-SDK program) through the interception server and the local engine."""

from __future__ import annotations

import argparse
import json
import re
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


async def test_a_run_with_no_learning_signal_left_stops_early_and_keeps_its_policy(tiny_model_dir, tmp_path):
    """Every rollout earns 1, so no group has a reward spread to learn from: after `max_empty_groups` such groups
    the run stops before `max_steps`, says why, and still saves the policy it holds (nothing trained is lost)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "solved", "instruction": "Say anything.",
                                 "grader": {"kind": "command", "command": "true"},
                                 "limits": {"wall_s": 60, "idle_s": 30}}) + "\n")
    config = TrainConfig(tasks=tasks, model=tiny_model_dir, agent="command",
                         command=f"{sys.executable} {Path(__file__).with_name('parity_task.py')}", out=tmp_path / "run",
                         max_tokens=4, num_generations=2, samples_per_step=2, max_steps=5, max_empty_groups=3,
                         concurrency=2)

    result = await train(config)

    assert result.steps == 0 and result.samples == []
    # checked while the trainer waits for samples: groups in flight may have finished past the third
    empty = re.match(r"the last (\d+) groups trained nothing", result.stopped_early or "")
    assert empty and int(empty[1]) >= 3, result.stopped_early
    assert (config.out / "final" / "model.safetensors").is_file() and (config.out / "final" / "config.json").is_file()


def test_a_run_whose_rollouts_all_fail_exits_1_with_the_cause_and_keeps_its_policy(tiny_model_dir, tmp_path, capsys):
    """An agent that cannot start (here: a program that is not there) fails every rollout: the run does not wait for
    samples that will not come, nor look like a finished one to a script that evaluates next. After
    `max_failed_groups` such groups `interceptor train` exits 1 and says why, in the agent's own words."""
    from trainer.train_main import run_train_from_args

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "instruction": "Say anything.",
                                 "grader": {"kind": "command", "command": "true"},
                                 "limits": {"wall_s": 60, "idle_s": 30}}) + "\n")
    config = tmp_path / "train.toml"
    config.write_text(f"""model = "{tiny_model_dir}"\ntasks = "{tasks}"\nout = "{tmp_path / 'run'}"
agent = "command"\ncommand = "{sys.executable} {tmp_path / 'missing_agent.py'}"
max_tokens = 4\nnum_generations = 2\nsamples_per_step = 2\nmax_steps = 3\nmax_failed_groups = 2\nconcurrency = 2
""")

    status = run_train_from_args(argparse.Namespace(config=config, set=[]))

    err = capsys.readouterr().err
    assert status == 1, err
    assert re.search(r"after 0 steps: every rollout of the last \d+ groups failed; the last: agent: .*missing_agent",
                     err, re.S), err
    assert (tmp_path / "run" / "final" / "config.json").is_file()


async def test_a_generator_serving_another_dtype_is_refused_before_training(tiny_model_dir, tmp_path):
    from trainer.engine import EngineConfig, LocalEngine
    from trainer.rl.precision import DtypeMismatch

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

    config = TrainConfig(tasks=_parity_tasks(tmp_path), model=smollm2_dir, agent="command",
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


@pytest.mark.vllm
async def test_two_grpo_steps_on_smollm2_served_by_vllm_reload_the_trained_weights_into_vllm(smollm2_dir, tmp_path):
    """`interceptor train` against a real vLLM serving SmolLM2 (CPU, imported untied: see the test below): after
    each step the trainer's weights reach vLLM by /pause -> reload_weights -> /resume (`ReloadFromDiskTransfer`),
    every sync timed; rollouts after the first sync are sampled by the new weights, and at the end vLLM serves the
    trained policy: its logprobs of a recorded sample are the saved final model's (teacher forced, fp32), not the
    imported model's."""
    import subprocess

    import torch
    from transformers import AutoModelForCausalLM

    from tests.e2e.test_token_exact_real_policy import prompt_logprobs
    from tests.vllm_server import require_vllm_python, start_vllm

    untied = tmp_path / "smollm2-untied"
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "make-model", "smollm2", str(untied),
                           "--untie-embeddings"], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = _parity_tasks(tmp_path)
    async with start_vllm(untied, python=require_vllm_python(), log_dir=tmp_path) as server:
        config = TrainConfig(tasks=tasks, model=untied, upstream=server.base_url, agent="command",
                             command=f"{sys.executable} {Path(__file__).with_name('parity_task.py')}",
                             out=tmp_path / "run", max_tokens=8, num_generations=4, samples_per_step=4, max_steps=2,
                             learning_rate=1e-4, concurrency=4)
        await train(config)
        records = read_records(config.out / "rollouts.jsonl")
        sample = next(s for r in records for s in r.samples if any(s.completion_mask))
        served = await prompt_logprobs(server.base_url, str(untied), sample.input_ids)

    lines = [json.loads(line) for line in (config.out / "metrics.jsonl").read_text().splitlines()]
    syncs = [line["perf/weight_sync_s"] for line in lines if "perf/weight_sync_s" in line]
    assert syncs and all(seconds > 0 for seconds in syncs)
    assert max(t.policy_version for r in records for s in r.samples for t in s.turns) >= 1

    ids = torch.tensor([sample.input_ids])

    def scored(model_dir: Path) -> list[float]:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.inference_mode():
            logprobs = model(input_ids=ids).logits[0].float().log_softmax(-1)
        return [float(logprobs[i - 1, token]) for i, token in enumerate(sample.input_ids) if i]

    final, imported = scored(config.out / "final"), scored(untied)
    assert scored(smollm2_dir) == pytest.approx(imported, abs=1e-5)  # untied, the imported model is the same model
    assert served[1:] == pytest.approx(final, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(served[1:], imported, strict=True)) > 1e-3


async def test_reloading_a_model_with_tied_embeddings_into_a_policy_server_is_refused(smollm2_dir, tmp_path):
    """vLLM (0.31) reloads a tied output head wrong in place (`weight_sync.TIED_RELOAD`): training SmolLM2 as
    imported (tied) against a policy server by reload is refused before any step, and the command says how to go
    on. Checked against the local engine over HTTP, which takes the same reload calls."""
    from trainer.engine import EngineConfig, LocalEngine
    from trainer.train_main import TiedReloadRefused

    async with LocalEngine(EngineConfig(model=smollm2_dir, port=0)) as engine:
        config = TrainConfig(tasks=_parity_tasks(tmp_path), model=smollm2_dir, upstream=engine.base_url,
                             out=tmp_path / "run", agent="command", command=f"{sys.executable} -c pass")
        with pytest.raises(TiedReloadRefused, match="ties its word embeddings.*--untie-embeddings"):
            await train(config)
    assert not (config.out / "metrics.jsonl").exists()  # no step was taken


def _parity_tasks(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({
        "id": "parity", "instruction": "Say anything.",
        "grader": {"kind": "python", "callable": "tests.trainer.parity_task:grade"},
        "limits": {"wall_s": 120, "idle_s": 60},
    }) + "\n")
    return tasks
