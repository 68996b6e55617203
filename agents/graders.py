"""Host-side grading: a finished rollout's submission and workspace -> a reward in [0, 1].

Runs after the agent has exited; nothing here is visible to the agent. Test commands (`command`, `swe`) run
through `exec`, the rollout sandbox's own `exec` when the runner grades (so code the agent wrote runs confined
like the agent), or a plain host process without one. A grader that cannot decide (its command times out, its
callable raises) raises `GraderFailed`: the rollout is then marked failed with cause `grader` and kept out of
training, never given a reward of 0 by accident.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
import os
import re
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agents.sandbox.base import ExecResult, Sandbox
from agents.specs.spec import program_paths
from agents.tasks import Grader, Task

__all__ = ["GRADERS", "GRADER_PATHS", "Grade", "Graded", "GraderFailed", "grade", "grade_box", "runs_from"]

# What set-up and test commands may run from this host in a box that does not share it: this Python (the SWE
# loader's default test command is `sys.executable -m pytest`).
GRADER_PATHS = program_paths(sys.executable)

_PYTEST_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)", re.MULTILINE)


class GraderFailed(Exception):
    """The grader could not produce a reward (an infrastructure fault, not a zero)."""


@dataclass(frozen=True, slots=True)
class Grade:
    reward: float
    detail: str


Exec = Callable[[str, float], Awaitable[ExecResult]]  # (shell command, timeout) -> how it ended, in the workspace


async def grade(
    task: Task, *, answer: object, answered: bool, workspace: Path, exec: Exec | None = None
) -> Grade:
    grader = task.grader
    run = exec or functools.partial(_exec_on_host, workspace)
    kind = GRADERS.get(grader.kind)
    if kind is None:  # a Grader is checked when built; this is for one built around that check
        raise GraderFailed(f"no grader of kind {grader.kind!r}")
    return await kind(Graded(grader=grader, task=task, answer=answer, answered=answered, workspace=workspace, run=run))


def runs_from(command: str) -> tuple[Path, ...]:
    """What a set-up or test command runs from on this host: this Python's installation when the command names it,
    else nothing (the box's own programs), so a box that copies what it runs from copies no more than that."""
    return GRADER_PATHS if sys.executable in command else ()


async def grade_box(task: Task, box: Sandbox, *, answer: object, answered: bool) -> Grade:
    """Grade a rollout whose agent ran in `box`: its workspace brought to the host first (host-side graders read it
    there), and the host's copy made the box's again before each command run inside (the SWE grader puts the hidden
    tests in place on the host). Where the box shares the host's file system both are nothing."""
    await box.pull_workspace()

    async def run(command: str, timeout_s: float) -> ExecResult:
        await box.push_workspace()
        return await box.exec(command, timeout_s=timeout_s, host_paths=runs_from(command))

    return await grade(task, answer=answer, answered=answered, workspace=box.workspace, exec=run)


@dataclass(frozen=True, kw_only=True)
class Graded:
    """What a grader of any kind is given: the task's grader, the task, what the agent submitted (if it did), the
    workspace on the host, and a way to run a command inside the sandbox."""

    grader: Grader
    task: Task
    answer: object
    answered: bool
    workspace: Path
    run: Exec


async def _grade_answer(graded: Graded) -> Grade:
    grader, answer = graded.grader, graded.answer
    if not graded.answered:
        return Grade(0.0, "no answer was submitted")
    given = str(answer).strip()
    expected = str(grader.expected).strip()
    if grader.match == "exact":
        ok = given == expected
    elif grader.match == "regex":
        ok = re.fullmatch(expected, given) is not None
    else:
        try:
            ok = math.isclose(float(given), float(expected), rel_tol=0.0, abs_tol=grader.tolerance)
        except ValueError:
            ok = False
    return Grade(1.0 if ok else 0.0, f"submitted {given[:200]!r}, expected {grader.match} {expected!r}")


async def _exec_on_host(workspace: Path, command: str, timeout_s: float) -> ExecResult:
    process = await asyncio.create_subprocess_shell(
        command,
        cwd=workspace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            output, _ = await process.communicate()
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)  # the shell and whatever it started: they hold the output pipe
        await process.wait()
        return ExecResult(exit_code=None, output="", timed_out=True, reason="timed out")
    return ExecResult(exit_code=process.returncode, output=output.decode(errors="replace"))


async def _grade_command(graded: Graded) -> Grade:
    grader, run = graded.grader, graded.run
    tests = (*grader.fail_to_pass, *grader.pass_to_pass)
    command = grader.command + ("".join(f" {shlex.quote(t)}" for t in tests) if tests else "")
    result = await run(command, grader.timeout_s)
    if result.exit_code is None:
        what = f"timed out after {grader.timeout_s}s" if result.timed_out else f"did not run ({result.reason})"
        raise GraderFailed(f"grader command {what}: {grader.command}")
    if not tests:
        return Grade(1.0 if result.exit_code == 0 else 0.0, f"exit {result.exit_code}")
    results = {name: outcome for outcome, name in _PYTEST_RESULT.findall(result.output)}
    missing = [t for t in tests if t not in results]
    if missing and result.exit_code not in (0, 1):
        raise GraderFailed(f"grader command failed (exit {result.exit_code}) before reporting {missing[:3]}")
    failed = [t for t in tests if results.get(t) not in ("PASSED", "XPASS")]
    return Grade(0.0 if failed else 1.0, f"{len(tests) - len(failed)}/{len(tests)} required tests passed")


async def _grade_swe(graded: Graded) -> Grade:
    """Restore the files the hidden test patch touches to the base commit (the agent's edits to them are reverted
    and reported), apply the patch, run the FAIL_TO_PASS and PASS_TO_PASS tests."""
    from agents.swe import apply_patch, restore_test_files  # noqa: PLC0415  (swe imports this module's types)

    grader, workspace = graded.grader, graded.workspace

    try:
        reverted = await asyncio.to_thread(restore_test_files, grader, workspace)
        await asyncio.to_thread(apply_patch, grader.test_patch, workspace)
    except (OSError, ValueError) as exc:
        raise GraderFailed(f"could not put the hidden tests in place: {exc}") from exc
    tested = await _grade_command(graded)
    if not reverted:
        return tested
    return Grade(tested.reward, f"{tested.detail}; the agent's edits to test files were reverted: {reverted}")


async def _grade_python(graded: Graded) -> Grade:
    grader = graded.grader
    module_name, _, function_name = grader.callable.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        value = function(graded.task, graded.answer, graded.workspace)
        if asyncio.iscoroutine(value):
            value = await value
        reward = float(value)
    except Exception as exc:  # user code: any failure is the grader's, and must not become a reward
        raise GraderFailed(f"grader {grader.callable} raised {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(reward):
        raise GraderFailed(f"grader {grader.callable} returned {reward}")
    return Grade(reward, f"{grader.callable} -> {reward}")


GRADERS: dict[str, Callable[[Graded], Awaitable[Grade]]] = {
    "answer": _grade_answer, "command": _grade_command, "python": _grade_python, "swe": _grade_swe,
}  # one per kind of `agents.tasks.GRADER_KINDS`
