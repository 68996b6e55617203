"""Sandboxes: where one rollout's agent runs, with limits, and how it ended.

    async with LocalSandbox() as box:                    # a fresh workspace and home; removed on exit
        ...copy the task's files into box.workspace...
        launch = spec.prepare(AgentRollout(..., workspace=box.workspace, home=box.home))
        result = await box.run(launch, limits=RunLimits(wall_s=900, idle_s=120), activity=heartbeat)
        ...grade box.workspace...
    result.outcome  # "exited" | "timeout" | "idle" | "cancelled" | "spawn_failed"

`Sandbox` is the interface a container or remote sandbox can implement later. `LocalSandbox` runs the agent as a
process of this machine:
- its own session and process group, under the subreaper shim of `agents.proctree` on Linux, so the whole tree
  (detached tool commands and orphans included) ends with the run, whatever the outcome;
- a wall-clock limit, and an idle watchdog: no output and no outside activity for `idle_s` (Pi waits forever on a
  stream that stalls after its headers, and prints nothing until it is done, so pass the server's activity);
- on timeout, idle or `stop`: SIGTERM to the tree, `kill_grace_s`, then SIGKILL; on cancellation of `run`
  itself: SIGKILL at once, then the `CancelledError` propagates;
- stdout and stderr kept as bounded tails with the launch's secrets replaced by `***`;
- only the host variables named in `passthrough_env` (PATH, locale) reach the agent, plus TMPDIR (its own);
  `bin_dir` comes first on PATH, for commands the runner gives the agent (e.g. `answer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, Self

from . import proctree
from .errors import AgentConfigError
from .output import OutputTail
from .spec import AgentLaunch

__all__ = [
    "ExecResult",
    "Heartbeat",
    "LocalSandbox",
    "LocalSandboxConfig",
    "Outcome",
    "RunLimits",
    "RunResult",
    "Sandbox",
]

Outcome = Literal["exited", "timeout", "idle", "cancelled", "spawn_failed"]
_SHIM = Path(proctree.__file__)
_DRAIN_S = 2.0  # after the tree is gone, how long the output pipes get to reach EOF (a process that escaped the
# tree could hold them open forever)
_STDIN_CHUNK = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    wall_s: float = 1800.0  # the whole run
    idle_s: float | None = 300.0  # no output and no outside activity for this long; None: no watchdog

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise AgentConfigError("wall_s must be positive")
        if self.idle_s is not None and self.idle_s <= 0:
            raise AgentConfigError("idle_s must be positive (or None)")


@dataclass(frozen=True, kw_only=True)
class RunResult:
    outcome: Outcome
    exit_code: int | None = None  # set when the agent exited by itself; 128+N when signal N ended it
    reason: str = ""  # why, for every outcome but a plain exit
    stdout: str = ""  # the tail, secrets replaced by ***
    stderr: str = ""
    stdout_dropped: int = 0  # bytes cut from the head of each stream
    stderr_dropped: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == "exited" and self.exit_code == 0


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """A command run in the sandbox for set-up or grading: how it ended and the tail of its combined output."""

    exit_code: int | None  # None when it did not exit by itself (timed out, could not start)
    output: str
    timed_out: bool = False
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Heartbeat:
    """The time (time.monotonic) of the agent's last sign of life seen outside its process, e.g. a request or a
    streamed chunk at the server. Call `beat()` on each; pass the heartbeat as `activity`."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def __call__(self) -> float:
        return self._last


class Sandbox(Protocol):
    """One rollout's place to run an agent. Entering creates the workspace and home; leaving removes them."""

    @property
    def workspace(self) -> Path: ...

    @property
    def home(self) -> Path: ...

    @property
    def bin_dir(self) -> Path: ...  # first on the agent's PATH

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def run(
        self,
        launch: AgentLaunch,
        *,
        limits: RunLimits,
        activity: Callable[[], float] | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult: ...

    async def exec(
        self, command: str, *, timeout_s: float, env: dict[str, str] | None = None, host_paths: tuple[Path, ...] = ()
    ) -> ExecResult:
        """Run a shell command in the workspace, inside the sandbox, as task set-up and graders do (`host_paths`:
        what it runs from on the host, for backends that do not share the host's file system)."""
        ...


@dataclass(frozen=True, kw_only=True)
class LocalSandboxConfig:
    parent_dir: Path | None = None  # where per-rollout directories are made (default: the system temp dir)
    passthrough_env: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "TZ")  # the only host variables the agent sees
    output_limit_bytes: int = 64 * 1024  # kept per stream
    kill_grace_s: float = 3.0  # between SIGTERM and SIGKILL
    poll_s: float = 0.2  # how often the watchdog looks at the clock
    keep_dirs: bool = False  # leave the directories behind (debugging)

    def __post_init__(self) -> None:
        if self.output_limit_bytes < 1024:
            raise AgentConfigError("output_limit_bytes must be at least 1024 (a secret must fit in it)")
        if self.kill_grace_s < 0 or self.poll_s <= 0:
            raise AgentConfigError("kill_grace_s must be >= 0 and poll_s > 0")


class LocalSandbox:
    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        self.config = config or LocalSandboxConfig()
        self._root: Path | None = None

    @property
    def root(self) -> Path:
        if self._root is None:
            raise RuntimeError("the sandbox is not entered")
        return self._root

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    async def __aenter__(self) -> Self:
        parent = str(self.config.parent_dir) if self.config.parent_dir else None
        self._root = Path(tempfile.mkdtemp(prefix="interceptor-rollout-", dir=parent)).resolve()  # mode 0700
        for path in (self.workspace, self.home, self.bin_dir, self.tmp):
            path.mkdir(mode=0o700)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        root, self._root = self._root, None
        if root is not None and not self.config.keep_dirs:
            await asyncio.to_thread(_remove_tree, root)

    async def run(
        self,
        launch: AgentLaunch,
        *,
        limits: RunLimits,
        activity: Callable[[], float] | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult:
        started = time.monotonic()
        env = {key: os.environ[key] for key in self.config.passthrough_env if key in os.environ}
        env["PATH"] = os.pathsep.join(filter(None, [str(self.bin_dir), env.get("PATH", os.defpath)]))
        env |= {"TMPDIR": str(self.tmp), **launch.env}
        executable = shutil.which(launch.argv[0], path=env.get("PATH", os.defpath))
        if executable is None:
            return RunResult(outcome="spawn_failed", reason=f"{launch.argv[0]}: not found or not executable")
        argv = [executable, *launch.argv[1:]]
        if proctree.supports_subreaper():
            argv = [sys.executable, "-I", str(_SHIM), "--grace", str(self.config.kill_grace_s), "--", *argv]
        argv, env = self._wrap(launch, argv, env)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=launch.cwd,
                env=env,
                stdin=asyncio.subprocess.PIPE if launch.stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own session and group: no terminal signals from ours reach it
            )
        except OSError as exc:
            return RunResult(outcome="spawn_failed", reason=f"{launch.argv[0]}: {exc.strerror or exc}")
        run = _Run(process, self.config, launch, started)
        outcome, reason = await run.supervise(limits, activity, stop)
        stdout, stderr = run.stdout, run.stderr
        code = process.returncode
        if code is not None and code < 0:  # the shim itself died of a signal (or there is no shim)
            code = 128 - code
        return RunResult(
            outcome=outcome,
            exit_code=code if outcome == "exited" else None,
            reason=reason,
            stdout=stdout.text(),
            stderr=stderr.text(),
            stdout_dropped=stdout.dropped,
            stderr_dropped=stderr.dropped,
            seconds=time.monotonic() - started,
        )

    async def exec(
        self, command: str, *, timeout_s: float, env: dict[str, str] | None = None, host_paths: tuple[Path, ...] = ()
    ) -> ExecResult:
        """Run `sh -c command` in the workspace, inside the sandbox (the same isolation, limits and reaping as the
        agent), with a combined output tail. Set-up and graders use it, so what they run is confined like the
        agent (a grader runs code the agent wrote)."""
        launch = AgentLaunch(argv=("/bin/sh", "-c", f"exec 2>&1; {command}"), env=dict(env or {}), cwd=self.workspace,
                             host_paths=host_paths)
        result = await self.run(launch, limits=RunLimits(wall_s=timeout_s, idle_s=None))
        if result.outcome == "exited":
            return ExecResult(exit_code=result.exit_code, output=result.stdout)
        return ExecResult(exit_code=None, output=result.stdout, timed_out=result.outcome == "timeout",
                          reason=result.reason or result.outcome)

    def _wrap(self, launch: AgentLaunch, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment actually started. A backend that runs the agent somewhere else (in its own
        namespaces: `agents.namespace_sandbox`) wraps them here and keeps the limits, watchdog and output above."""
        return argv, env


class _Run:
    """One started process: its output pumps, its watchdog and its ending."""

    def __init__(
        self, process: asyncio.subprocess.Process, config: LocalSandboxConfig, launch: AgentLaunch, started: float
    ) -> None:
        self.process = process
        self.config = config
        self.launch = launch
        self.started = started
        self.last_output = started
        self.stdout = OutputTail(limit_bytes=config.output_limit_bytes, secrets=launch.secrets)
        self.stderr = OutputTail(limit_bytes=config.output_limit_bytes, secrets=launch.secrets)

    async def supervise(
        self, limits: RunLimits, activity: Callable[[], float] | None, stop: asyncio.Event | None
    ) -> tuple[Outcome, str]:
        assert self.process.stdout is not None and self.process.stderr is not None
        pumps = [
            asyncio.create_task(self._pump(self.process.stdout, self.stdout)),
            asyncio.create_task(self._pump(self.process.stderr, self.stderr)),
        ]
        if self.launch.stdin is not None:
            pumps.append(asyncio.create_task(self._feed(self.launch.stdin)))
        try:
            verdict = await self._watch(limits, activity, stop)
            if verdict[0] != "exited":
                await self._terminate()
            # After a plain exit the shim has already ended what the agent left running. (Off Linux there is no
            # shim, and stragglers in the agent's group are not hunted: once the leader is reaped its group id may
            # belong to someone else.)
            return verdict
        except BaseException:
            # Cancelled (or a bug): nothing of this rollout may outlive the call. No grace: we are being torn down.
            self._kill_everything()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), _DRAIN_S)
            raise
        finally:
            await _drain(pumps)

    async def _watch(
        self, limits: RunLimits, activity: Callable[[], float] | None, stop: asyncio.Event | None
    ) -> tuple[Outcome, str]:
        deadline = self.started + limits.wall_s
        exited = asyncio.ensure_future(self.process.wait())
        stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            while True:
                waiting = {exited} if stopping is None else {exited, stopping}
                await asyncio.wait(waiting, timeout=self.config.poll_s, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    return "exited", ""
                now = time.monotonic()
                if stopping is not None and stopping.done():
                    return "cancelled", "stopped by the caller"
                if now >= deadline:
                    return "timeout", f"still running after the {limits.wall_s:g} s wall-clock limit"
                if limits.idle_s is not None:
                    seen = max(self.last_output, activity() if activity is not None else self.started)
                    if now - seen >= limits.idle_s:
                        return "idle", f"no output and no activity for {limits.idle_s:g} s"
        finally:
            for future in (exited, stopping):
                if future is not None and not future.done():
                    future.cancel()

    async def _terminate(self) -> None:
        """SIGTERM (the shim passes it on to the whole tree), the grace period, then SIGKILL to everything."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        if not proctree.supports_subreaper():
            self._signal_group(signal.SIGTERM)
        try:
            # The shim spends up to the same grace on the tree, then SIGKILLs it: give it a moment beyond that.
            await asyncio.wait_for(asyncio.shield(self.process.wait()), self.config.kill_grace_s + 2.0)
        except TimeoutError:
            self._kill_everything()
            await self.process.wait()

    def _kill_everything(self) -> None:
        if proctree.supports_subreaper() and self.process.returncode is None:
            proctree.kill_tree(self.process.pid, include_root=True)
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        # Only while the leader is not reaped: until then its pid, which is the group id (start_new_session), cannot
        # be reused by an unrelated process.
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    async def _pump(self, stream: asyncio.StreamReader, tail: OutputTail) -> None:
        while chunk := await stream.read(65536):
            tail.feed(chunk)
            self.last_output = time.monotonic()

    async def _feed(self, data: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        # An agent that exits without reading its stdin closes the pipe: that is its business, not an error.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for start in range(0, len(data), _STDIN_CHUNK):
                stdin.write(data[start : start + _STDIN_CHUNK])
                await stdin.drain()
            stdin.close()
            await stdin.wait_closed()


async def _drain(pumps: list[asyncio.Task]) -> None:
    """Let the pumps read to EOF; a pipe still held open after the tree is gone (a process that left the tree by
    itself) is abandoned rather than waited on forever. Never raises: it runs while a cancellation unwinds."""
    _, pending = await asyncio.wait(pumps, timeout=_DRAIN_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)


def _remove_tree(root: Path) -> None:
    """Remove a rollout's directory, including what an agent made read-only (chmod 000 directories, etc.)."""

    def make_writable_and_retry(function, path, _exc) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)

    shutil.rmtree(root, onerror=make_writable_and_retry)  # onexc needs Python 3.12
