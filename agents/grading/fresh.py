"""Grade a rollout in a fresh box of its task, from what the agent changed, after the agent's box is gone.

    base = await baseline(box)                           # after the task's set-up, before the agent runs
    ...the agent runs...
    captured = await capture(task, box, base)            # its changes: the allowed ones carried, the rest refused
    ...the agent's box is closed: nothing it left running touches the grade...
    graded = await grade_fresh(task, open_box, captured, answer=..., answered=..., setup_timeout_s=...)

The fresh box is made like the agent's (`open_box`: the runner's pool), its workspace set up from the task again,
and only the allowed changes applied (`agents.grading.rules`); its home, PATH and `bin` are its own, never the
agent's. A grader that cannot decide on the agent's changes is tried on the task's clean base in another fresh box:
if it decides there, the failure was the agent's doing (a test run it broke, a timeout its code caused) and the
grade is 0; only a grader that fails on the clean base too is a grader failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents.graders import Grade, GraderFailed, grade_box
from agents.grading.changes import Carried, Change, Entry, carry, changes, manifest
from agents.grading.changes import apply as apply_changes
from agents.grading.rules import Refusal, refusal
from agents.sandbox.contract import Sandbox
from agents.tasks import Task
from agents.workspace import SetupFailed, prepare_workspace

__all__ = ["Captured", "baseline", "capture", "grade_fresh", "graded_fresh", "tampering_event"]

_EVENT_PATHS = 50  # refused changes listed in one `tampering` event (all are counted)

OpenBox = Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]


@dataclass(frozen=True, slots=True)
class Captured:
    carried: tuple[Carried, ...]  # the allowed changes, with their bytes
    refused: tuple[Refusal, ...]
    changed_bytes: int  # the allowed files' bytes
    too_large: bool  # past the task's `grading.max_change_bytes`: nothing is carried


def graded_fresh(task: Task) -> bool:
    """Graded from its changes in a fresh box (an answer is graded on its own, wherever)."""
    return task.grading.where == "fresh" and task.grader.kind != "answer"


async def baseline(box: Sandbox) -> dict[str, Entry]:
    """The workspace as the task's set-up left it."""
    await box.pull_workspace()
    return await asyncio.to_thread(manifest, box.workspace)


async def capture(task: Task, box: Sandbox, base: dict[str, Entry]) -> Captured:
    """What the agent changed since `base`, read out of its box now (its box is closed before grading)."""
    await box.pull_workspace()
    after = await asyncio.to_thread(manifest, box.workspace)
    allowed, refused = [], []
    for change in changes(base, after):
        if _generated(change, box.workspace):
            continue  # what running Python and pytest leaves (a timestamped .pyc, the cache): neither carried nor held
        why = refusal(change, allow=task.grading.allow, refuse=task.grading.refuse)
        (allowed if why is None else refused).append(why or change)
    carried = await asyncio.to_thread(carry, allowed, box.workspace)
    size = sum(len(item.data or b"") for item in carried)
    too_large = size > task.grading.max_change_bytes
    return Captured(carried=() if too_large else tuple(carried), refused=tuple(refused), changed_bytes=size,
                    too_large=too_large)  # fmt: skip


def tampering_event(refused: tuple[Refusal, ...]) -> dict:
    """The details of a rollout's `tampering` event: the refused changes (the first `_EVENT_PATHS`), counted by kind."""
    counts: dict[str, int] = {}
    for item in refused:
        counts[item.kind] = counts.get(item.kind, 0) + 1
    listed = [{"path": item.path, "kind": item.kind, "change": item.what} for item in refused[:_EVENT_PATHS]]
    return {"refused": listed, "counts": counts, "total": len(refused)}


async def grade_fresh(
    task: Task, open_box: OpenBox, captured: Captured, *, answer: object, answered: bool, setup_timeout_s: float
) -> Grade:
    if captured.too_large:
        return Grade(0.0, f"the agent changed {captured.changed_bytes:,} bytes of files, over the task's "
                          f"{task.grading.max_change_bytes:,}: not graded")  # fmt: skip
    if captured.refused and task.grading.tampering == "zero":
        return Grade(0.0, f"tampering ({len(captured.refused)} refused changes) and the task's policy is zero")
    try:
        graded = await _in_fresh_box(task, open_box, captured.carried, answer, answered, setup_timeout_s)
    except GraderFailed as failed:
        try:
            await _in_fresh_box(task, open_box, (), answer, answered, setup_timeout_s)
        except GraderFailed as also:
            raise GraderFailed(f"{failed}; on the task's clean base too: {also}") from failed
        return Grade(0.0, f"the grader failed on the agent's changes and decides on the task's clean base: {failed}")
    if captured.refused:
        kinds = sorted({refused.kind for refused in captured.refused})
        return Grade(graded.reward, f"{graded.detail}; {len(captured.refused)} changes refused ({', '.join(kinds)})")
    return graded


async def _in_fresh_box(
    task: Task, open_box: OpenBox, carried: tuple[Carried, ...], answer: object, answered: bool, setup_timeout_s: float
) -> Grade:
    async with open_box() as box:
        try:
            await prepare_workspace(task, box, setup_timeout_s=setup_timeout_s)
        except SetupFailed as exc:
            raise GraderFailed(f"the fresh box could not be set up: {exc}") from exc
        if carried:
            await box.pull_workspace()
            try:
                await asyncio.to_thread(apply_changes, list(carried), box.workspace)
            except OSError as exc:
                raise GraderFailed(f"the agent's changes could not be applied to a fresh workspace: {exc}") from exc
            await box.push_workspace()
        return await grade_box(task, box, answer=answer, answered=answered, fresh=True)


def _generated(change: Change, root: Path) -> bool:
    """`.pytest_cache/`, a `__pycache__` directory, and a `.pyc` checked against its source (PEP 552 flags 0, its
    timestamp, as CPython writes them; 3, its hash, as pytest's assertion rewriting does): made by running the code,
    dropped (a fresh box makes its own; a poisoned one would validate against an unchanged source). An unchecked
    `.pyc` (flags 1) is made on purpose only, to be loaded whatever the source says: refused, and reported."""
    parts = change.path.split("/")
    if ".pytest_cache" in parts or (parts[-1] == "__pycache__" and change.entry is not None
                                    and change.entry.kind == "dir"):
        return True
    if not change.path.endswith(".pyc") or change.entry is None or change.entry.kind != "file":
        return change.path.endswith(".pyc") and change.entry is None  # a deleted .pyc
    try:
        with open(root / change.path, "rb") as file:
            header = file.read(8)
    except OSError:
        return False
    return len(header) == 8 and int.from_bytes(header[4:8], "little") in (0, 3)
