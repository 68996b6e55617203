"""`interceptor run`: rollouts of a real agent on a task file, with a progress line per rollout and a summary.

    interceptor run --agent pi --tasks examples/tasks/arithmetic.jsonl --upstream local -n 4 --out runs/pi

`--upstream local` builds the tiny model if needed (with tool-calling training when available) and starts the
local engine in this process; otherwise `--upstream URL` is a vLLM server (interception_gate, needs `--model DIR`
for the tokenizer and chat template) or any OpenAI-compatible API (`--mode black_box`; its key from the
environment variable INTERCEPTOR_UPSTREAM_API_KEY, never from argv).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from agents.errors import AgentConfigError
from agents.runner import RunnerConfig
from agents.sandbox.cgroups import ResourceLimits
from agents.sandbox.pool import PoolConfig
from agents.sources import load_tasks
from agents.specs.registry import AgentSettings, build_agent
from agents.specs.spec import AgentSpec
from agents.tasks import Task
from interceptor.config import SamplingSettings
from interceptor.store.records import RolloutRecord

from trainer.drivers import check_driver, harbor_driver
from trainer.policy_stack import PolicyStack, StackConfig
from trainer.upstreams import LOCAL, parse_upstream

__all__ = ["progress_printer", "run_from_args", "summary_table"]


def _agent(args: argparse.Namespace, *, context_window: int) -> AgentSpec:
    try:
        return build_agent(args.agent, AgentSettings(context_window=context_window, max_tokens=args.max_tokens,
                                                     command=args.command))
    except AgentConfigError as exc:
        raise SystemExit(f"interceptor run: {exc}") from None


def _resources(args: argparse.Namespace) -> ResourceLimits | None:
    memory = args.memory_mib * 1024 * 1024 if args.memory_mib is not None else None
    try:
        limits = ResourceLimits(cpus=args.cpus, memory_bytes=memory, pids=args.pids)
    except AgentConfigError as exc:
        raise SystemExit(f"--cpus/--memory-mib/--pids: {exc}") from None
    return limits if limits.any else None


def _check_sandbox(choice: str, resources: ResourceLimits | None = None, tasks: Sequence[Task] = ()) -> None:
    """A backend this machine lacks, limits on one that cannot hold them, or a task's egress list or workdir on one
    that cannot honour it, refused before anything starts (by the runner's own rules:
    `agents.sandbox.backends.BoxChooser`; under `auto` the runner chooses when it starts, and for those tasks here)."""
    from agents.sandbox.backends import BoxChooser, Placement

    particular = [task for task in tasks if task.egress or task.workdir]
    if choice == "auto" and not particular:
        return
    try:
        choose = BoxChooser(choice, Placement(resources=resources))
    except AgentConfigError as exc:
        raise SystemExit(f"--sandbox: {exc}") from None
    for task in particular:
        try:
            choose(task.image, task.network, task.egress, task.workdir)
        except AgentConfigError as exc:
            raise SystemExit(f"task {task.id}: {exc}") from None


def progress_printer(total: int):
    """A runner's `on_finished`: one line per finished rollout, with a bar."""
    done = Counter()
    started = time.perf_counter()

    def report(record: RolloutRecord) -> None:
        done["n"] += 1
        outcome = f"reward {record.reward:g}" if record.reward is not None else f"{record.failure.cause}"
        turns = sum(len(s.turns) for s in record.samples) or record.usage.get("turns", 0)
        width = 24
        filled = width * done["n"] // total
        print(
            f"[{'#' * filled}{'.' * (width - filled)}] {done['n']}/{total} {record.metadata.get('task_id')} "
            f"#{record.metadata.get('index')}: {record.status}, {outcome}, {turns} turns "
            f"({time.perf_counter() - started:.0f}s)",
            flush=True,
        )

    return report


def summary_table(records: list[RolloutRecord]) -> str:
    by_task: dict[str, list[RolloutRecord]] = defaultdict(list)
    for record in records:
        by_task[str(record.metadata.get("task_id"))].append(record)
    width = max([20, *map(len, by_task)])  # a Harbor task's id is org/name
    lines = [f"{'task':<{width}} {'rollouts':>8} {'ok':>4} {'failed':>6} {'mean reward':>11} {'turns':>6} "
             f"{'tokens':>7} {'forks':>5}"]
    for task_id, group in sorted(by_task.items()):
        rewards = [r.reward for r in group if r.reward is not None]
        lines.append(
            f"{task_id:<{width}} {len(group):>8} {sum(r.status == 'ok' for r in group):>4} "
            f"{sum(r.status != 'ok' for r in group):>6} "
            f"{(sum(rewards) / len(rewards)) if rewards else float('nan'):>11.3f} "
            f"{sum(len(s.turns) for r in group for s in r.samples):>6} "
            f"{sum(len(s.input_ids) for r in group for s in r.samples):>7} "
            f"{sum(r.forks for r in group):>5}"
        )
    causes = Counter(r.failure.cause for r in records if r.failure is not None)
    if causes:
        lines.append("failures by cause: " + ", ".join(f"{cause} {count}" for cause, count in causes.most_common()))
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    if args.warm_pool < 0:
        raise SystemExit("--warm-pool must be 0 or more")
    resources = _resources(args)  # refused before anything starts, as a backend this machine lacks is
    driver = harbor_driver(args)  # refused before anything starts: Harbor missing, an agent with no box install
    _check_sandbox(args.sandbox, resources)
    if args.swe_repos:
        from agents.swe import load_swe_tasks

        tasks = load_swe_tasks(args.tasks, repos=args.swe_repos)
    else:
        tasks = load_tasks(args.tasks, harbor_runs=driver is not None)
    if driver is None:
        _check_sandbox(args.sandbox, resources, tasks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "rollouts.jsonl"
    try:
        upstream = parse_upstream(args.upstream)
    except ValueError as exc:
        raise SystemExit(f"--upstream: {exc}") from None
    local = upstream == (LOCAL,)
    stack_config = StackConfig(
        upstream=upstream,
        model=Path(args.model) if args.model else (out.parent / "model" if local else None),
        mode=args.mode,
        record_path=record_path,
        box_listen=args.box_listen,
        box_url=args.box_url,
    )

    def runner_config(server) -> RunnerConfig:
        if driver is not None:
            check_driver(driver, server, tasks)
        return RunnerConfig(
            agent=None if driver else _agent(args, context_window=server.policy.max_model_len if server.policy else 32768),
            driver=driver,
            sampling=SamplingSettings(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed),
            concurrency=args.concurrency,
            backend=args.sandbox,
            resources=resources,
            pool=PoolConfig(size=args.warm_pool),
        )

    progress = progress_printer(len(tasks) * args.n)
    async with PolicyStack(stack_config, runner=runner_config, runner_options={"on_finished": progress}) as stack:
        agent = driver.name if driver else args.agent
        print(f"{len(tasks)} task(s) x {args.n} with {agent} on {stack.upstream.base_url} ({args.mode})", flush=True)
        # what `interceptor view OUT` reads to decode the tokens
        (out / "setup.json").write_text(json.dumps({
            "model": str(Path(stack.model_dir).resolve()) if stack.model_dir else None,
            "agent": agent, "mode": args.mode,
        }, indent=2) + "\n")
        records = await stack.runner.run_tasks(tasks, n=args.n)
    print()
    print(summary_table(records))
    print(f"\ntrajectories: {record_path}  (interceptor inspect {record_path}; interceptor view {out})")
    return 0 if any(r.status == "ok" for r in records) else 1


def run_from_args(args: argparse.Namespace) -> int:
    from trainer.models.local_model import LOCAL_MODEL_ERRORS, local_model_error_exit

    try:
        return asyncio.run(run(args))
    except LOCAL_MODEL_ERRORS as exc:
        return local_model_error_exit("run", exc)
    except KeyboardInterrupt:
        print("stopped: agents were ended and finished rollouts kept", file=sys.stderr)
        return 130
