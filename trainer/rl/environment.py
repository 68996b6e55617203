"""This project's tasks, sandboxes and graders as environments for TRL's `GRPOTrainer(environment_factory=...)`.

    tasks = load_tasks("examples/tasks/arithmetic.jsonl")
    trainer = GRPOTrainer(model=..., train_dataset=task_dataset(tasks), reward_funcs=grader_reward,
                          environment_factory=environment_factory_for(tasks),
                          args=GRPOConfig(..., max_tool_calling_iterations=EnvironmentConfig().max_turns))

The contract with TRL (1.16), and the choices made here:

- The dataset (`task_dataset`) has one row per task: `prompt`, the task's instruction as the user message, and
  `task_id`. TRL makes one `TaskEnvironment` per rollout (pooled, reused batch after batch) and calls
  `reset(**row)`: that releases the previous episode's sandbox, opens one for `task_id` and prepares its workspace
  as `agents.runner` does (`trainer.rl.environment_host`). `reset` returns None when the row's prompt already holds the
  instruction (rows from `task_dataset` do), else the instruction, which TRL appends to the last user message.
- Every public method but `reset` is a tool (TRL's rule): `bash`, `read_file`, `write_file`, `answer`. They run in
  the episode's sandbox, with bounded output (cut with a note of how much), and a malformed call (wrong type,
  missing argument, a path outside the workspace, content over the limit) comes back as an `error: ...` string
  (`trainer.rl.environment_tools`). There is deliberately no public `close()`: it would be offered to the model as a
  tool. Release with `with env:`, `SandboxHost.close()` (atexit does it for the shared host), or `__del__`.
- TRL has no way for a tool to end the loop. An episode ends when the model submits (`answer`, or the sandbox's
  `answer` command through `bash`: the tiny model is trained on `bash("answer N")`) or after `max_turns` tool calls;
  from then on every tool call returns "error: the episode has ended ..." without running, and TRL's loop stops when
  the model replies without a call, at `max_tool_calling_iterations` (set it to `max_turns`) or at
  `max_completion_length`.
- The reward is the host grader's (`agents.graders.grade`), computed by the reward function `grader_reward` after
  generation, for the whole batch at once on the sandboxes' loop, as the runner grades: from the episode's changes
  in a fresh box of the task, its own box closed first, changes that alter how it is tested refused
  (`EpisodeState.tampering`; `agents.grading`), or in its own box where the task says `grading.where: in_place`.
  An infrastructure failure (the sandbox could not be made or prepared, the grader could not
  decide) is `None`, which TRL turns into NaN and leaves out of the group's baseline: never a reward of 0. There is
  no `get_reward()` (TRL would add it as a second reward source, graded one rollout at a time).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agents.errors import AgentError
from agents.graders import Grade, GraderFailed, grade_box
from agents.grading.fresh import capture, grade_fresh, tampering_event
from agents.sandbox.base import Sandbox
from agents.sources import load_tasks
from agents.tasks import Task

from trainer.rl.environment_host import OpenedSandbox, SandboxFailed, SandboxHost
from trainer.rl.environment_tools import ToolError, bounded, tool, workspace_path

__all__ = ["EnvironmentConfig", "EpisodeState", "TaskEnvironment", "environment_factory_for", "grader_reward",
           "task_dataset"]

log = logging.getLogger("trainer.rl.environment")


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig:
    max_turns: int = 8  # tool calls per episode; the call that reaches it still runs
    command_timeout_s: float = 60.0  # one `bash` call, inside the sandbox
    max_output_chars: int = 4000  # what one tool result shows the model (a 4k-token context fills fast)
    max_write_chars: int = 100_000  # `write_file` content above this is refused, not cut

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.command_timeout_s <= 0:
            raise ValueError("max_turns must be at least 1 and command_timeout_s positive")
        if self.max_output_chars < 200 or self.max_write_chars < 1:
            raise ValueError("max_output_chars must be at least 200 and max_write_chars positive")


@dataclass(frozen=True, kw_only=True)
class EpisodeState:
    """What a reward function or a test may read of an episode (`TaskEnvironment.state`)."""

    task_id: str
    calls: tuple[str, ...]  # the tools that ran, in order (refused calls are not counted)
    answered: bool
    answer: str | None
    ended: str | None  # why no more tool calls run, or None while they do
    failure: str | None  # the infrastructure failure that left the episode without a sandbox
    tampering: dict | None = None  # changes refused before grading: {"refused", "counts", "total"}; None: none


_UNGRADED = object()


@dataclass(kw_only=True)
class _Episode:
    """One rollout's state: its task, its sandbox (None when it could not be made) and what the model did."""

    task: Task
    opened: OpenedSandbox | None
    failure: str | None = None  # why there is no sandbox: the reward is None
    calls: list[str] = field(default_factory=list)
    answered: bool = False
    answer: str | None = None
    ended: str | None = None  # why no more tool calls run
    reward: object = field(default=_UNGRADED)  # float | None once graded
    tampering: dict | None = None  # the changes refused before grading (`agents.grading.fresh.tampering_event`)


class TaskEnvironment:
    """One rollout's environment: a task from a task file, run in its own sandbox. See the module docstring."""

    def __init__(self, tasks: Sequence[Task], *, config: EnvironmentConfig | None = None,
                 host: SandboxHost | None = None) -> None:
        self._tasks = {task.id: task for task in tasks}
        self._config = config or EnvironmentConfig()
        self._host = host  # None: the process's shared host, on the first reset
        self._episode: _Episode | None = None

    def reset(self, task_id: str | None = None, prompt: object = None, **row: object) -> str | None:
        """Start an episode for the row's task (TRL passes every column of the dataset row)."""
        task = self._tasks.get(str(task_id))
        if task is None:  # a dataset that does not match the task file: a configuration error, raised at once
            raise KeyError(f"the dataset row names task {task_id!r}, which is not among this environment's tasks")
        self._release()
        host = self._host = self._host or SandboxHost.shared()
        try:
            opened = host.call(host.open(task))
            self._episode = _Episode(task=task, opened=opened)
        except SandboxFailed as exc:
            log.warning("task %s: %s (its reward will be None)", task.id, exc)
            self._episode = _Episode(task=task, opened=None, failure=str(exc), ended=str(exc))
        return None if _holds(prompt, task.instruction) else task.instruction

    @property  # a property, not a method: TRL offers every public method to the model as a tool
    def state(self) -> EpisodeState | None:
        """The current episode, or None before the first reset."""
        episode = self._episode
        if episode is None:
            return None
        return EpisodeState(task_id=episode.task.id, calls=tuple(episode.calls), answered=episode.answered,
                            answer=episode.answer, ended=episode.ended, failure=episode.failure,
                            tampering=episode.tampering)  # fmt: skip

    @tool
    def bash(self, command: str) -> str:
        """Execute a shell command in the task's workspace and return its exit status and output.

        Args:
            command: The command to run, by /bin/sh, in the workspace directory.
        """
        if not command.strip():
            raise ToolError("the command is empty")
        episode, box = self._take_turn("bash")
        result = self._host.call(box.exec(command, timeout_s=self._config.command_timeout_s,
                                          env={"HOME": str(box.home)}))
        if result.exit_code is not None:
            status = f"exit status {result.exit_code}"
        elif result.timed_out:
            status = f"timed out after {self._config.command_timeout_s:g}s (the command was killed)"
        else:
            status = f"did not run: {result.reason}"
        self._read_submitted(episode)
        return self._closing(episode, f"{status}\n{bounded(result.output, self._config.max_output_chars)}")

    @tool
    def read_file(self, path: str) -> str:
        """Read a text file in the task's workspace.

        Args:
            path: The file's path, relative to the workspace.
        """
        episode, box = self._take_turn("read_file")
        target = workspace_path(box.workspace, path)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file" if target.exists() else f"{path!r} does not exist")
        limit = self._config.max_output_chars
        with open(target, "rb") as handle:
            data = handle.read(limit * 4 + 1)  # at most 4 bytes a character: enough to fill the limit
        text = data.decode("utf-8", errors="replace")
        size = os.path.getsize(target)
        if len(text) > limit or len(data) < size:
            shown = text[:limit]
            text = f"{shown}\n[... cut: {size - len(shown.encode('utf-8', errors='replace'))} more bytes of {size}]"
        return self._closing(episode, text)

    @tool
    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the task's workspace, replacing it if it exists (parent directories are made).

        Args:
            path: The file's path, relative to the workspace.
            content: The whole text of the file.
        """
        if len(content) > self._config.max_write_chars:
            limit = self._config.max_write_chars
            raise ToolError(f"content is {len(content)} characters; at most {limit} are accepted")
        episode, box = self._take_turn("write_file")
        target = workspace_path(box.workspace, path)
        if target.is_dir():
            raise ToolError(f"{path!r} is a directory")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise ToolError(f"could not write {path!r}: {exc.strerror or exc}") from exc
        return self._closing(episode, f"wrote {len(content)} characters to {path}")

    @tool
    def answer(self, value: str) -> str:
        """Submit the final answer for the task. This ends the episode: no tool runs after it.

        Args:
            value: The answer, as text.
        """
        episode, _ = self._take_turn("answer")
        episode.answered, episode.answer = True, value
        episode.ended = "the answer was submitted"
        return "answer recorded; the episode is over"

    # ------------------------------------------------------------------ the episode

    def _take_turn(self, name: str) -> tuple[_Episode, Sandbox]:
        episode = self._episode
        if episode is None:
            raise ToolError("no episode is running (reset was not called)")
        if episode.ended is not None:
            raise ToolError(f"the episode has ended ({episode.ended}); no more tool calls run")
        episode.calls.append(name)
        if len(episode.calls) >= self._config.max_turns:
            episode.ended = f"the limit of {self._config.max_turns} tool calls was reached"
        assert episode.opened is not None  # an episode without a sandbox starts ended
        return episode, episode.opened.box

    def _read_submitted(self, episode: _Episode) -> None:
        """Take an answer the sandbox's `answer` command wrote, ending the episode."""
        path = episode.opened.answer_path
        if not episode.answered and path.is_file():
            episode.answered, episode.answer = True, path.read_text(encoding="utf-8", errors="replace").strip()
            episode.ended = "the answer was submitted"

    def _closing(self, episode: _Episode, text: str) -> str:
        if episode.ended is None:
            return text
        return f"{text}\n[{episode.ended}: the episode is over]"

    async def _grade(self) -> float | None:
        episode = self._episode
        if episode is None or episode.opened is None:
            return None
        if episode.reward is _UNGRADED:
            try:
                graded = await self._graded(episode)
                episode.reward = graded.reward
            except (GraderFailed, AgentError) as exc:
                log.warning("task %s: the grader failed (its reward is None): %s", episode.task.id, exc)
                episode.reward = None
        return episode.reward

    async def _graded(self, episode: _Episode) -> Grade:
        """In the episode's own box (`grading.where: in_place`, or an answer), else from its changes in a fresh box
        of the task, the episode's box closed first (nothing it left running touches the grade)."""
        opened, task, host = episode.opened, episode.task, self._host
        assert opened is not None and host is not None
        if opened.base is None:
            return await grade_box(task, opened.box, answer=episode.answer, answered=episode.answered)
        captured = await capture(task, opened.box, opened.base)
        await host.release(opened)
        if captured.refused:
            episode.tampering = tampering_event(captured.refused)
            log.warning("task %s: %d changes refused before grading (%s)", task.id, len(captured.refused),
                        ", ".join(f"{kind} {n}" for kind, n in episode.tampering["counts"].items()))
        return await grade_fresh(task, host.fresh_box(task), captured, answer=episode.answer,
                                 answered=episode.answered, setup_timeout_s=host.setup_timeout_s)  # fmt: skip

    def _release(self) -> None:
        episode, self._episode = self._episode, None
        if episode is not None and episode.opened is not None and self._host is not None and not self._host.closed:
            self._host.call(self._host.release(episode.opened))

    def __enter__(self) -> TaskEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._release()

    def __del__(self) -> None:  # the safety net: an environment dropped with a sandbox open
        episode = self.__dict__.get("_episode")
        if episode is not None and episode.opened is not None and self._host is not None:
            self._host.call_soon(self._host.release(episode.opened))


def _holds(prompt: object, instruction: str) -> bool:
    """Whether a dataset row's prompt (text, or chat messages) already carries the instruction."""
    if isinstance(prompt, str):
        return instruction in prompt
    if isinstance(prompt, list):
        return any(isinstance(m, dict) and isinstance(m.get("content"), str) and instruction in m["content"]
                   for m in prompt)
    return False


def grader_reward(environments: Sequence[TaskEnvironment], **kwargs: object) -> list[float | None]:
    """TRL reward function: each rollout's host-grader reward, None where the infrastructure failed."""
    rewards: list[float | None] = [None] * len(environments)
    by_host: dict[SandboxHost, list[int]] = {}
    for index, environment in enumerate(environments):
        if environment._host is not None and not environment._host.closed:
            by_host.setdefault(environment._host, []).append(index)
    for host, indexes in by_host.items():
        graded = host.call(_grade_all([environments[i] for i in indexes]))
        for index, reward in zip(indexes, graded, strict=True):
            rewards[index] = reward
    return rewards


async def _grade_all(environments: Sequence[TaskEnvironment]) -> list[float | None]:
    return list(await asyncio.gather(*(environment._grade() for environment in environments)))


def task_dataset(tasks: Sequence[Task] | Path | str):
    """A `datasets.Dataset` with one row per task: `prompt` (the instruction as the user message) and `task_id`."""
    from datasets import Dataset  # noqa: PLC0415  (datasets is the trainer's dependency, imported when used)

    tasks = load_tasks(tasks) if isinstance(tasks, (str, Path)) else tasks
    return Dataset.from_list([{"prompt": [{"role": "user", "content": task.instruction}], "task_id": task.id}
                              for task in tasks])


def environment_factory_for(tasks: Sequence[Task] | Path | str, *, config: EnvironmentConfig | None = None,
                            host: SandboxHost | None = None) -> Callable[[], TaskEnvironment]:
    """The `environment_factory` for these tasks (a task file or loaded tasks)."""
    tasks = tuple(load_tasks(tasks) if isinstance(tasks, (str, Path)) else tasks)
    return lambda: TaskEnvironment(tasks, config=config, host=host)
