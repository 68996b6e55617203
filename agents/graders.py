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
import json
import math
import os
import re
import secrets
import shlex
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agents.errors import AgentConfigError
from agents.grading import pytest_report
from agents.sandbox.base import ExecResult, Sandbox
from agents.specs.spec import Bind, program_paths
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


# (shell command, timeout, binds=(), env=None) -> how it ended, in the workspace; `binds` (`agents.specs.spec.Bind`):
# host paths shown at paths of the box's own while it runs (a Harbor verifier's /tests and /logs/verifier); `env`:
# variables it gets besides the box's (never in its argv)
Exec = Callable[..., Awaitable[ExecResult]]


async def grade(
    task: Task, *, answer: object, answered: bool, workspace: Path, exec: Exec | None = None, fresh: bool = False
) -> Grade:
    """`fresh`: the workspace is a fresh box's with the agent's allowed changes (`agents.grading.fresh`); pytest runs
    then report through `agents.grading.pytest_report`, not their output."""
    grader = task.grader
    run = exec or functools.partial(_exec_on_host, workspace)
    kind = GRADERS.get(grader.kind)
    if kind is None:  # a Grader is checked when built; this is for one built around that check
        raise GraderFailed(f"no grader of kind {grader.kind!r}")
    return await kind(Graded(grader=grader, task=task, answer=answer, answered=answered, workspace=workspace, run=run,
                             fresh=fresh))


def runs_from(command: str) -> tuple[Path, ...]:
    """What a set-up or test command runs from on this host: this Python's installation when the command names it,
    else nothing (the box's own programs), so a box that copies what it runs from copies no more than that."""
    return GRADER_PATHS if sys.executable in command else ()


async def grade_box(task: Task, box: Sandbox, *, answer: object, answered: bool, fresh: bool = False) -> Grade:
    """Grade in `box`: its workspace brought to the host first (host-side graders read it there), the host's copy
    made the box's again before each command run inside (the SWE grader puts the hidden tests in place on the host)
    and brought back after it (a report it wrote). Where the box shares the host's file system these are nothing."""
    await box.pull_workspace()

    async def run(command: str, timeout_s: float, binds: tuple[Bind, ...] = (),
                  env: dict[str, str] | None = None) -> ExecResult:
        await box.push_workspace()
        try:
            result = await box.exec(command, timeout_s=timeout_s, host_paths=runs_from(command), binds=binds, env=env)
        except AgentConfigError as exc:  # a backend that cannot show the binds
            raise GraderFailed(str(exc)) from exc
        await box.pull_workspace()
        return result

    return await grade(task, answer=answer, answered=answered, workspace=box.workspace, exec=run, fresh=fresh)


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
    fresh: bool = False  # a fresh box's workspace: pytest reports through a file, not its output


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


async def _exec_on_host(
    workspace: Path, command: str, timeout_s: float, binds: tuple[Bind, ...] = (), env: dict[str, str] | None = None
) -> ExecResult:
    if binds:
        raise GraderFailed(f"this grader shows {', '.join(b.target for b in binds)} in a box: it needs one")
    process = await asyncio.create_subprocess_shell(
        command,
        cwd=workspace,
        env={**os.environ, **env} if env else None,
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
    if graded.fresh and (tests or "pytest" in grader.command):
        return await _grade_pytest_report(graded, tests)
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


async def _grade_pytest_report(graded: Graded, tests: tuple[str, ...]) -> Grade:
    """The listed tests run with `agents.grading.pytest_report` loaded, and graded from its report: every one must
    have passed its call (or passed although marked xfail) and failed nowhere (set-up, teardown)."""
    grader = graded.grader
    name = f"interceptor_report_{secrets.token_hex(6)}"
    folder = graded.workspace / f".{name}"
    folder.mkdir(mode=0o755)
    (folder / f"{name}.py").write_bytes(Path(pytest_report.__file__).read_bytes())
    report = folder / "report.jsonl"
    command = (f"export INTERCEPTOR_REPORT={shlex.quote(str(report))} PYTHONPATH={shlex.quote(str(folder))}; "
               f"{grader.command}{''.join(f' {shlex.quote(t)}' for t in tests)} -p {name}")
    result = await graded.run(command, grader.timeout_s)
    if result.exit_code is None:
        what = f"timed out after {grader.timeout_s}s" if result.timed_out else f"did not run ({result.reason})"
        raise GraderFailed(f"grader command {what}: {grader.command}")
    outcomes, status = _read_report(report)
    if status is None:
        raise GraderFailed(f"the test run ended (exit {result.exit_code}) before pytest finished its report")
    if not tests:  # pytest's own exit status, not the process's (code under test can end that with any code)
        return Grade(1.0 if status == 0 else 0.0, f"pytest finished with status {status} (report)")
    failed = [t for t in tests if outcomes.get(t) not in ("passed", "xpassed")]
    return Grade(0.0 if failed else 1.0, f"{len(tests) - len(failed)}/{len(tests)} required tests passed (report)")


def _read_report(path: Path) -> tuple[dict[str, str], int | None]:
    """Each test's outcome (a failure in any phase wins over a pass) and the session's exit status (None: it did not
    finish)."""
    outcomes: dict[str, str] = {}
    finished = None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return outcomes, None
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn last line: the run did not finish
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("finished"), int):
            finished = item["finished"]
        elif isinstance(item.get("nodeid"), str):
            outcome = str(item.get("outcome"))
            if outcomes.get(item["nodeid"]) not in ("failed", "skipped", "xfailed"):
                outcomes[item["nodeid"]] = outcome
    return outcomes, finished


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


async def _grade_harbor(graded: Graded) -> Grade:
    """A Harbor task's verifier: its `tests/` shown read-only at /tests, a directory of this grading's own at
    /logs/verifier, `bash /tests/test.sh` run in the workspace, the reward read from what it left there
    (`reward.json`'s "reward", or its one value; else `reward.txt`). Its exit status is not the grade (Harbor's
    contract); no reward file, or one that is not a finite number, is a grader failure."""
    grader = graded.grader
    assert grader.tests is not None
    with tempfile.TemporaryDirectory(prefix="interceptor-verifier-") as logs:
        Path(logs).chmod(0o777)  # the box's user writes it (Harbor's verifier directory is world-writable too)
        binds = (Bind(grader.tests.resolve(), "/tests"), Bind(Path(logs), "/logs/verifier", writable=True))
        result = await graded.run("bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1", grader.timeout_s,
                                  binds, dict(grader.env))  # fmt: skip
        if result.exit_code is None:
            what = f"timed out after {grader.timeout_s:g}s" if result.timed_out else f"did not run ({result.reason})"
            raise GraderFailed(f"the verifier {what}")
        reward, source = _harbor_reward(Path(logs))
    return Grade(reward, f"{reward:g} from {source} (test.sh exit {result.exit_code})")


def _harbor_reward(logs: Path) -> tuple[float, str]:
    for name in ("reward.json", "reward.txt"):
        path = logs / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")[:100_000]
        try:
            value = json.loads(text) if name == "reward.json" else float(text.strip())
        except ValueError as exc:
            raise GraderFailed(f"{name} is not a number: {text[:100]!r}") from exc
        if isinstance(value, dict):
            if "reward" not in value and len(value) != 1:
                raise GraderFailed(f"reward.json names several rewards and none is 'reward': {sorted(value)[:10]}")
            value = value.get("reward", next(iter(value.values()), None))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GraderFailed(f"{name} holds {value!r}, not a finite number")
        return float(value), name
    raise GraderFailed("the verifier left no reward.json or reward.txt in /logs/verifier")


GRADERS: dict[str, Callable[[Graded], Awaitable[Grade]]] = {
    "answer": _grade_answer, "command": _grade_command, "python": _grade_python, "swe": _grade_swe,
    "harbor": _grade_harbor,
}  # one per kind of `agents.tasks.GRADER_KINDS`
