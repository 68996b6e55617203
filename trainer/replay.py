"""`interceptor replay RECORDS --rollout ID --tasks FILE`: run a real agent again against a recorded rollout, with no
model, to reproduce it or to see whether the interception still holds after the agent changed.

The policy server is the record itself (`interceptor.tools.replay_upstream.ReplayUpstream`): every chat call the agent
makes is rendered by the interception gate as in training, matched to the recorded turn whose prompt it equals
(token for token, or after normalising dates, sandbox paths and the host's OS version) and answered with the tokens
that turn sampled, streamed in the agent's dialect. The agent runs its tools for real in a fresh sandbox and the
host grades the task. The report says whether the replay matched turn for turn and the reward agreed, or where it
first diverged (which request, and whether the system prompt, the tools or a message changed).

    report = await replay_rollout(record, task, agent=PiAgent(...), model_dir=Path("runs/model"))
    assert report.matched, report.summary()
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents.runner import Runner, RunnerConfig
from agents.sources import load_tasks
from agents.specs.spec import AgentSpec
from agents.tasks import Task
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.store.recorder import read_records
from interceptor.store.records import RolloutRecord
from interceptor.tools.replay_upstream import Divergence, Outcome, ReplayUpstream
from interceptor.viewer.main import run_model

__all__ = ["ReplayReport", "replay_rollout", "run_replay_from_args"]


@dataclass(frozen=True)
class ReplayReport:
    rollout_id: str
    recorded_calls: int
    outcomes: list[Outcome]
    recorded_status: str
    recorded_reward: float | None
    replay: RolloutRecord

    @property
    def first_divergence(self) -> tuple[int, Divergence] | None:
        return next(((o.request, o.divergence) for o in self.outcomes if o.divergence is not None), None)

    @property
    def turn_for_turn(self) -> bool:
        """Every recorded chat call was made again, in a matching request, and nothing more."""
        return (self.first_divergence is None and len(self.outcomes) == self.recorded_calls
                and all(o.matched is not None for o in self.outcomes))

    @property
    def reward_agrees(self) -> bool:
        return self.replay.reward == self.recorded_reward and self.replay.status == self.recorded_status

    @property
    def matched(self) -> bool:
        return self.turn_for_turn and self.reward_agrees

    def summary(self) -> str:
        lines = [f"replay of rollout {self.rollout_id}: {len(self.outcomes)} of {self.recorded_calls} recorded "
                 f"chat call(s) made again"]
        for outcome in self.outcomes:
            if outcome.divergence is None:
                how = f"match after normalising {', '.join(outcome.volatile)}" if outcome.normalised else "exact match"
                sample, turn = outcome.matched
                lines.append(f"  request {outcome.request}: {how} (sample {sample} turn {turn})")
            else:
                lines.append(f"  request {outcome.request}: DIVERGED: {outcome.divergence.describe()}")
        lines.append(f"  recorded: {self.recorded_status}, reward {self.recorded_reward}; "
                     f"replayed: {self.replay.status}, reward {self.replay.reward}"
                     + (f" ({self.replay.failure.cause}: {self.replay.failure.message[:200]})" if self.replay.failure
                        else ""))
        verdict = ("matched turn for turn, and the reward agreed" if self.matched else
                   "matched turn for turn, but the outcome differs" if self.turn_for_turn else
                   f"diverged at request {self.first_divergence[0]}" if self.first_divergence else
                   f"the agent stopped after {len(self.outcomes)} of {self.recorded_calls} chat calls")
        lines.append(f"verdict: {verdict}")
        return "\n".join(lines)


def _max_model_len(model_dir: Path) -> int:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 32768
    return int(config.get("max_position_embeddings") or 32768)


async def replay_rollout(record: RolloutRecord, task: Task, *, agent: AgentSpec | Callable[[int], AgentSpec],
                         model_dir: Path, backend: str = "auto", workdir: Path | None = None) -> ReplayReport:
    """Run `agent` on `task` against `record` as its policy; `agent` may be a function of the context window.
    `backend`: the sandbox backend, as `--sandbox` names it (`agents.sandbox.backends`)."""
    from transformers import AutoTokenizer

    if not record.samples:
        raise ValueError(f"rollout {record.rollout_id} has no samples to replay (it made no chat call)")
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(model_dir))
    context = _max_model_len(Path(model_dir))
    own = tempfile.TemporaryDirectory(prefix="interceptor-replay-") if workdir is None else None
    where = Path(own.name) if own else Path(workdir)
    try:
        async with ReplayUpstream(record, tokenizer, max_model_len=context) as upstream:
            config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), mode="interception_gate",
                                  model_dir=Path(model_dir), record_path=where / "replay.jsonl")
            async with InterceptionServer(config) as server:
                spec = agent(context) if callable(agent) else agent  # agent specs are plain dataclasses
                runner_config = RunnerConfig(agent=spec, concurrency=1, backend=backend)
                async with Runner(server, runner_config) as runner:
                    replayed = await runner.run_rollout(task, metadata={"replay_of": record.rollout_id})
    finally:
        if own is not None:
            own.cleanup()
    return ReplayReport(rollout_id=record.rollout_id, recorded_calls=len(upstream.turns),
                        outcomes=list(upstream.outcomes), recorded_status=record.status,
                        recorded_reward=record.reward, replay=replayed)


async def _replay(args: argparse.Namespace) -> int:
    from trainer.run_main import _agent, _check_sandbox

    _check_sandbox(args.sandbox)

    records = Path(args.records)
    matches = [r for r in read_records(records) if r.rollout_id == args.rollout]
    if not matches:
        raise ValueError(f"no rollout {args.rollout!r} in {records}")
    record = matches[-1]
    tasks = {task.id: task for task in load_tasks(args.tasks)}
    task_id = record.metadata.get("task_id")
    if task_id not in tasks:
        raise ValueError(f"the rollout's task {task_id!r} is not in {args.tasks}")
    _check_sandbox(args.sandbox, None, [tasks[task_id]])
    args.agent = args.agent or record.metadata.get("agent")
    if not args.agent:
        raise ValueError("the record does not name its agent: give --agent")
    model = Path(args.model) if args.model else run_model(records)
    if model is None:
        raise ValueError(f"no model directory: give --model (no setup.json beside {records} names one)")
    report = await replay_rollout(record, tasks[task_id], agent=lambda context: _agent(args, context_window=context),
                                  model_dir=model, backend=args.sandbox)
    print(report.summary())
    return 0 if report.matched else 1


def run_replay_from_args(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_replay(args))
    except (OSError, ValueError) as exc:
        print(f"interceptor replay: error: {exc}", file=sys.stderr)
        return 2
