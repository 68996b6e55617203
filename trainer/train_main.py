"""`interceptor train --config FILE`: GRPO on a real agent, on one machine.

    policy server (local engine in this process, or vLLM) <- interception server <- agents (runner)
         ^ weights (in process, or reload from disk)            | token-exact samples, host rewards
         '---------------- TRL AsyncGRPOTrainer <- rollout worker (groups, advantages) <-'

The config file is TOML; every key is optional except `tasks`:

    model = "runs/train/model"      # a model directory; built (the tiny model, trained to call tools) if missing
    upstream = "local"              # or a vLLM URL serving `model`, or comma-separated URLs of replicas (weights
                                    # then go to each by reload from disk)
    agent = "command"               # pi | opencode | command
    command = "python examples/agents/simple_agent.py"
    tasks = "examples/tasks/arithmetic.jsonl"
    out = "runs/train"
    temperature = 1.0               # the trainer assumes it (raw logprobs): keep 1.0 unless vLLM runs processed
    max_tokens = 64
    num_generations = 4
    samples_per_step = 8
    max_steps = 20
    learning_rate = 1e-4
    max_staleness = 2
    concurrency = 4
    max_empty_groups = 64           # groups in a row with no reward spread (nothing to learn) before the run stops
                                    # early, saving the policy it has
    max_failed_groups = 4           # groups in a row whose every rollout failed (a broken agent, sandbox or policy
                                    # server) before the run fails (exit 1), saving the policy it has
    attention = "auto"              # auto | fa3 | torch: TRL's FA3 kernel where it loads, else torch (trainer/rl/trl_compat.py)
    dtype = "auto"                  # auto | float32 | bfloat16 | float16: bf16 on a CUDA GPU, fp32 on CPU
    allow_dtype_mismatch = false    # train even when the generator serves another dtype (trainer/rl/precision.py)
    allow_tied_reload = false       # reload weights into vLLM even when the model ties its embeddings, which vLLM
                                    # 0.31 reloads wrong (weight_sync.TIED_RELOAD): refused unless set
    device = "auto"                 # the local engine's device: auto (cuda when present) | cpu | cuda | cuda:N
    weight_sync = "reload"          # reload | nccl: a vLLM upstream gets weights from disk, or by TRL's NCCL client
    fleet = ""                      # "ray": rollouts run on a Ray fleet, one interception node per Ray node
                                    # (trainer/fleet.py); "ray://HOST:PORT" joins that cluster
    host = "127.0.0.1"              # the interception server's address; "0.0.0.0" in a container (the Space)
    port = 0                        # 0: a free port
    view = false                    # the run viewer at /view on the server's port (and / redirects there)

    [chain_weights]                 # each chain kind's weight on its rollout's advantage (the defaults below)
    main = 1.0                      # also: fork, subagent, compaction = 1.0; summary (compaction summaries) and
    auxiliary = 0.0                 # auxiliary (title requests) = 0.0, left out

Any key can be set on the command line too: `--set max_steps=2 --set view=true` (the value is read as TOML, and a
bare word as a string). Secrets come from the environment, never from the file or argv: INTERCEPTOR_ADMIN_TOKEN
turns on the admin API (and guards /metrics), INTERCEPTOR_VIEW_TOKEN guards the viewer.

The trainer's loop runs in a worker thread; this process's event loop keeps serving the engine, the interception
server and the agents. At start it writes what it runs with to `OUT/setup.json` (attention and why, the trainer's
and the generator's dtype). Per step it prints the metrics (among them `logprob_gap/mean`: how far the trainer's
logprobs of the sampled tokens are from the generator's), appends them to `OUT/metrics.jsonl`, and at the end saves
the trained policy with its tokenizer to `OUT/final/` and plots the mean reward per step to `OUT/reward.png`
(matplotlib, when installed). trackio is used when installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import tomllib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, fields
from pathlib import Path

from trainer.rl.grpo_setup import TiedReloadRefused
from trainer.rl.worker import DEFAULT_MAX_STALENESS
from trainer.upstreams import LOCAL, parse_upstream

__all__ = ["TiedReloadRefused", "TrainConfig", "TrainResult", "agent_spec", "run_train_from_args", "train"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    tasks: Path
    model: Path = Path("runs/train/model")
    upstream: str = "local"
    agent: str = "command"
    command: str = "python examples/agents/simple_agent.py --max-turns 3"
    out: Path = Path("runs/train")
    temperature: float = 1.0
    max_tokens: int = 64
    num_generations: int = 4
    samples_per_step: int = 8
    max_steps: int = 20
    learning_rate: float = 1e-4
    max_staleness: int = DEFAULT_MAX_STALENESS
    concurrency: int = 4
    max_empty_groups: int = 64
    max_failed_groups: int = 4
    seed: int = 0
    attention: str = "auto"
    dtype: str = "auto"
    allow_dtype_mismatch: bool = False
    allow_tied_reload: bool = False
    device: str = "auto"
    weight_sync: str = "reload"
    fleet: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    view: bool = False
    # who runs each rollout: "interceptor" (its boxes, `agent`) or "harbor" (a Harbor trial each: `agents.harbor`)
    driver: str = "interceptor"
    harbor_agent: str = "pi"
    harbor_env: str = "docker"
    harbor_install: str = "box"
    harbor_api_format: str = ""
    harbor_trials: str = ""
    box_listen: str = ""  # HOST:PORT for boxes not on this host (`interceptor.box_port`); box_url: what they are told
    box_url: str = ""
    # each chain kind's weight on its rollout's advantage (`trainer.rl.advantages`): e.g. {summary = 1.0} trains
    # compaction summaries too; kinds not named keep their defaults
    chain_weights: dict = field(default_factory=dict)
    upstreams: tuple[str, ...] = field(init=False, repr=False)  # `upstream` parsed: ("local",) or the URLs

    def __post_init__(self) -> None:
        for name in ("tasks", "model", "out"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "upstreams", parse_upstream(self.upstream))
        from agents.specs.registry import trainable

        if self.agent not in trainable():
            raise ValueError(f"agent must be one of {', '.join(trainable())}, not {self.agent!r}")
        if (self.max_steps < 1 or self.num_generations < 2 or self.samples_per_step < 1 or self.max_empty_groups < 1
                or self.max_failed_groups < 1):
            raise ValueError("max_steps >= 1, num_generations >= 2, samples_per_step >= 1, max_empty_groups >= 1 and "
                             "max_failed_groups >= 1 are needed")
        from trainer.rl.precision import DTYPES
        from trainer.rl.trl_compat import ATTENTION_CHOICES

        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, not {self.attention!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.device != "auto" and self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.weight_sync not in ("reload", "nccl"):
            raise ValueError(f"weight_sync must be 'reload' or 'nccl', not {self.weight_sync!r}")
        if self.weight_sync == "nccl" and (self.local or len(self.upstreams) > 1):
            raise ValueError("weight_sync = 'nccl' is TRL's transfer to one vLLM server: upstream must be its URL")
        if not isinstance(self.chain_weights, dict):
            raise ValueError(f"chain_weights must be a table of kind = weight, not {self.chain_weights!r}")
        from trainer.rl.advantages import GroupFilter

        GroupFilter(chain_weights=self.chain_weights)  # refuses an unknown kind or a negative weight here
        if self.driver not in ("interceptor", "harbor"):
            raise ValueError(f"driver must be 'interceptor' or 'harbor', not {self.driver!r}")
        if self.driver == "harbor" and self.fleet:
            raise ValueError("driver = 'harbor' runs its trials from this process: a fleet is not taken with it yet")
        if self.fleet and self.fleet != "ray" and not self.fleet.startswith("ray://"):
            raise ValueError(f"fleet must be '', 'ray' or 'ray://HOST:PORT', not {self.fleet!r}")

    @property
    def local(self) -> bool:
        """The policy is served by the local engine in this process."""
        return self.upstreams == (LOCAL,)

    @classmethod
    def load(cls, path: Path | str, overrides: Sequence[str] = ()) -> TrainConfig:
        """The file's keys, then each `KEY=VALUE` of `overrides` (VALUE read as TOML; a bare word is a string)."""
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--set wants KEY=VALUE, not {item!r}")
            try:
                data[key.strip()] = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError:
                data[key.strip()] = value.strip()
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        types = {f.name: f.type for f in fields(cls)}
        for key, value in data.items():  # a wrong type is refused here, not deep inside a run
            wanted = {"int": int, "float": (int, float), "bool": bool, "str": str, "Path": str}.get(str(types[key]))
            if wanted is not None and (not isinstance(value, wanted) or (wanted is int and isinstance(value, bool))):
                raise ValueError(f"{path}: {key} must be {types[key]}, not {value!r}")
        return cls(**data)  # relative paths are relative to the working directory, as on a command line


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    steps: int  # optimizer steps taken
    stopped_early: str | None  # why the run ended before max_steps (no learning signal left), else None
    failed: str | None  # why the run failed (every rollout of `max_failed_groups` groups in a row failed), else None
    reward_per_step: list[float]
    engine_weight_version: int | None
    samples: list[tuple[int, float, int]]  # (group_id, advantage, model_version) of every sample trained on
    seconds: float
    metrics_path: Path


def agent_spec(config: TrainConfig, *, context_window: int):
    from agents.specs.registry import AgentSettings, build_agent

    return build_agent(config.agent, AgentSettings(context_window=context_window, max_tokens=config.max_tokens,
                                                   command=config.command))


def _log_callback(metrics_path: Path, rewards: dict[int, float]):
    from transformers import TrainerCallback

    class PrintMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 (TRL's callback signature)
            logs = dict(logs or {})
            reward = logs.get("rollouts/reward_mean")
            if reward is not None:
                rewards[state.global_step] = float(reward)  # the last log of a step wins
            with open(metrics_path, "a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")
            keys = ("loss", "rollouts/reward_mean", "rollouts/reward_std", "ratio", "logprob_gap/mean")
            shown = {k: logs[k] for k in keys if isinstance(logs.get(k), (int, float))}
            print(f"step {state.global_step}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()), flush=True)

    return PrintMetrics()


async def train(config: TrainConfig) -> TrainResult:
    import torch
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from agents.runner import RunnerConfig
    from agents.sources import load_tasks
    from interceptor import SamplingSettings

    from trainer.policy_stack import PolicyStack, StackConfig
    from trainer.rl.advantages import GroupFilter
    from trainer.rl.grpo_setup import check_the_policy_servers, grpo_args, weight_transfer
    from trainer.rl.logprob_gap import with_logprob_gap
    from trainer.rl.precision import trainer_dtype
    from trainer.rl.trl_compat import apply_trl_compat, resolve_attention
    from trainer.rl.weight_sync import GatedTransfer
    from trainer.rl.worker import InterceptorRolloutWorker, NoLearningSignal, RolloutsFailing, WorkerConfig
    from trainer.drivers import check_driver, harbor_driver
    from trainer.run_main import _check_sandbox

    started = time.perf_counter()
    on_cpu = not torch.cuda.is_available()
    attention = resolve_attention(config.attention)
    apply_trl_compat(attention)
    dtype = trainer_dtype(config.dtype)
    device = ("cpu" if on_cpu else "cuda") if config.device == "auto" else config.device
    config.out.mkdir(parents=True, exist_ok=True)
    metrics_path = config.out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    driver = harbor_driver(argparse.Namespace(
        driver=config.driver, harbor_agent=config.harbor_agent, harbor_env=config.harbor_env,
        harbor_install=config.harbor_install, harbor_api_format=config.harbor_api_format or None,
        harbor_trials=config.harbor_trials or None))  # fmt: skip
    tasks = load_tasks(config.tasks, harbor_runs=driver is not None)
    if driver is None:
        _check_sandbox("auto", None, tasks)  # a task's egress list this machine cannot enforce, refused before a step
    loop = asyncio.get_running_loop()
    stack_config = StackConfig(upstream=config.upstreams,
                               model=config.model, record_path=config.out / "rollouts.jsonl", seed=config.seed,
                               engine_device=device, engine_dtype=dtype, host=config.host, port=config.port,
                               admin_token=os.environ.get("INTERCEPTOR_ADMIN_TOKEN") or None, view=config.view,
                               box_listen=config.box_listen or None, box_url=config.box_url or None)

    def runner_config(server) -> RunnerConfig:
        if driver is not None:
            check_driver(driver, server, tasks)
        return RunnerConfig(
            agent=None if driver else agent_spec(config, context_window=server.policy.max_model_len),
            driver=driver,
            # The trainer scores at temperature `temperature` with no top-k/top-p: sample the same way.
            sampling=SamplingSettings(temperature=config.temperature, max_tokens=config.max_tokens),
            concurrency=config.concurrency,
        )

    async with PolicyStack(stack_config, runner=runner_config) as stack, AsyncExitStack() as stack_exit:
        engine, server, runner, model_dir = stack.engine, stack.server, stack.runner, stack.model_dir
        urls = [stack.upstream.base_url, *stack.upstream.replicas]
        await check_the_policy_servers(config, urls, attention=attention, dtype=dtype,
                                        engine_device=device if engine else None, model_dir=model_dir)
        groups = runner  # where groups run: this process's runner, or the fleet's nodes (the gate too)
        if config.fleet:
            from trainer.fleet import Fleet, FleetConfig

            groups = await stack_exit.enter_async_context(Fleet(FleetConfig(
                upstream=tuple(urls), model=model_dir, out=config.out, runner=runner_config(server),
                address=None if config.fleet == "ray" else config.fleet,
            )))
        worker = InterceptorRolloutWorker(
            runner=groups,
            tasks=tasks,
            loop=loop,
            config=WorkerConfig(
                num_generations=config.num_generations,
                samples_per_step=config.samples_per_step,
                max_staleness=config.max_staleness,
                filter=GroupFilter(chain_weights=config.chain_weights),
                max_empty_groups=config.max_empty_groups,
                max_failed_groups=config.max_failed_groups,
            ),
        )
        gate = server if groups is runner else groups
        inner = weight_transfer(config, engine, urls, model_dir=model_dir, loop=loop)
        transfer = GatedTransfer(inner, gate=gate, loop=loop) if inner is not None else None
        args = grpo_args(config, dtype=dtype, on_cpu=on_cpu, nccl_url=urls[0] if transfer is None else None)
        rewards: dict[int, float] = {}
        trainer = with_logprob_gap(AsyncGRPOTrainer)(
            model=str(model_dir),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["unused: the rollout worker owns the prompts"]}),
            rollout_worker=worker,
            weight_transfer=transfer,
            callbacks=[_log_callback(metrics_path, rewards)],
        )
        if transfer is None:  # TRL's own NCCL client: every sync still goes through the interception gate
            trainer.weight_transfer = GatedTransfer(trainer.weight_transfer, gate=gate, loop=loop)
        stopped_early = failed = None
        try:
            await asyncio.to_thread(trainer.train)
        except NoLearningSignal as exc:  # what was learned so far is kept: saved below like a finished run's
            stopped_early = str(exc)
            print(f"stopped after step {trainer.state.global_step}: {exc}", flush=True)
        except RolloutsFailing as exc:  # a fault, not the policy's doing: saved too, and the command fails
            failed = str(exc)
        await asyncio.to_thread(trainer.save_model, str(config.out / "final"))  # the trained policy, with its tokenizer
        version = engine.weight_version if engine is not None else None
    per_step = [rewards[step] for step in sorted(rewards)]
    _plot(sorted(rewards.items()), config.out / "reward.png")
    return TrainResult(
        steps=trainer.state.global_step,
        stopped_early=stopped_early,
        failed=failed,
        reward_per_step=per_step,
        engine_weight_version=version,
        samples=list(worker.pushed),
        seconds=time.perf_counter() - started,
        metrics_path=metrics_path,
    )


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _plot(rewards: list[tuple[int, float]], path: Path) -> None:
    if not rewards or not _installed("matplotlib"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot([step for step, _ in rewards], [reward for _, reward in rewards], marker="o")
    axis.set_xlabel("training step")
    axis.set_ylabel("mean reward of the step's groups")
    axis.set_ylim(-0.05, 1.05)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run_train_from_args(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        config = TrainConfig.load(args.config, args.set or ())
    except (OSError, ValueError) as exc:
        print(f"interceptor train: error: {exc}", file=sys.stderr)
        return 2
    from trainer.models.local_model import LOCAL_MODEL_ERRORS, local_model_error_exit

    from trainer.rl.precision import DtypeMismatch

    try:
        result = asyncio.run(train(config))
    except LOCAL_MODEL_ERRORS as exc:
        return local_model_error_exit("train", exc)
    except (DtypeMismatch, TiedReloadRefused) as exc:
        print(f"interceptor train: error: {exc}", file=sys.stderr)
        return 2
    if result.failed:
        print(f"interceptor train: error: after {result.steps} steps: {result.failed}\n"
              f"the policy so far: {config.out / 'final'}", file=sys.stderr)
        return 1
    if result.stopped_early:
        print(f"\nstopped early: {result.stopped_early}")
    print(f"\n{result.steps} steps in {result.seconds:.0f}s; mean reward per step: "
          + " ".join(f"{r:.2f}" for r in result.reward_per_step))
    print(f"metrics: {result.metrics_path}; plot: {config.out / 'reward.png'}")
    return 0
