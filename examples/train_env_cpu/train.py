"""GRPO on CPU through `trainer.rl.environment`: TRL's GRPOTrainer owns generation and the tool loop; the task's
sandbox runs the tools; the host grader gives the reward.

    .venv/bin/interceptor make-tiny-model --tool-calling runs/train-env/model   # or let this script build it
    .venv/bin/python examples/train_env_cpu/train.py --out runs/train-env

Writes `OUT/reward.jsonl` (one line per step: the step's mean reward and its spread) and TRL's log history.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL 1.16

from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from agents.tasks import load_tasks  # noqa: E402
from trainer.models.local_model import ensure_local_model  # noqa: E402
from trainer.rl.environment import EnvironmentConfig, environment_factory_for, grader_reward, task_dataset  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "tasks" / "arithmetic.jsonl"


class RewardLog(TrainerCallback):
    """One JSON line per logged step: the step, its mean reward, the spread, seconds since the start."""

    def __init__(self, path: Path) -> None:
        self.path, self.started = path, time.monotonic()
        path.write_text("")

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if logs and "reward" in logs:
            line = {"step": state.global_step, "reward": round(logs["reward"], 4),
                    "reward_std": round(logs.get("reward_std", float("nan")), 4),
                    "tools_per_completion": logs.get("tools/call_frequency"),
                    "seconds": round(time.monotonic() - self.started, 1)}
            with self.path.open("a") as out:
                out.write(json.dumps(line) + "\n")
            print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/train-env/model"), help="built here when absent")
    parser.add_argument("--tasks", type=Path, default=TASKS)
    parser.add_argument("--out", type=Path, default=Path("runs/train-env"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="completions per step (a multiple of the group size)")
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = ensure_local_model(args.model)
    tasks = load_tasks(args.tasks)
    environment = EnvironmentConfig(max_turns=args.max_turns)
    args.out.mkdir(parents=True, exist_ok=True)
    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True, bf16=False,  # float32 on CPU, as trainer.rl.trl_compat.CPU_CONFIG
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.batch,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=environment.max_turns,
        temperature=1.0,
        learning_rate=args.learning_rate,
        beta=0.0,  # no reference model: half the memory and forward passes
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=str(model),
        args=config,
        train_dataset=task_dataset(tasks),
        reward_funcs=grader_reward,
        environment_factory=environment_factory_for(tasks, config=environment),
        callbacks=[RewardLog(args.out / "reward.jsonl")],
    )
    trainer.train()
    (args.out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))


if __name__ == "__main__":
    main()
