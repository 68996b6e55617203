"""A task's workspace in a box: its directory and files copied in, its set-up commands run inside.

Made the same way for the agent's box, for the fresh box a rollout is graded in (`agents.grading.fresh`) and for
TRL environments' episodes.
"""

from __future__ import annotations

from agents.graders import runs_from
from agents.sandbox.contract import Sandbox
from agents.specs.spec import BoxFile
from agents.tasks import Task

__all__ = ["SetupFailed", "prepare_workspace"]

_OUTPUT_KEPT = 4000  # characters of a failed set-up command's output kept in its message


class SetupFailed(Exception):
    """A task's workspace could not be prepared: a set-up command failed or timed out."""


async def prepare_workspace(task: Task, box: Sandbox, *, setup_timeout_s: float) -> None:
    """The task's workspace in `box`: its directory copied, its files written, its set-up commands run inside the
    sandbox (with the grader's programs reachable). Used by the runner and by TRL environments alike."""
    if task.workspace is not None:
        await box.put_tree(task.workspace)
    await box.put_files(tuple(BoxFile(box.workspace / name, text.encode(), 0o644) for name, text in task.files.items()))
    for command in task.setup:
        result = await box.exec(command, timeout_s=setup_timeout_s, host_paths=runs_from(command))
        if result.timed_out:
            raise SetupFailed(f"setup command timed out: {command}")
        if not result.ok:
            tail = result.output[-_OUTPUT_KEPT:]
            raise SetupFailed(f"setup command failed ({result.exit_code or result.reason}): {command}\n{tail}")
