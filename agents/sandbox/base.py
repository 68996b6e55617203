"""Sandboxes: where one rollout's agent runs, with limits, and how it ended.

    async with LocalSandbox() as box:                    # a fresh workspace and home; removed on exit
        ...copy the task's files into box.workspace...
        launch = spec.prepare(AgentRollout(..., workspace=box.workspace, home=box.home))
        result = await box.run(launch, limits=RunLimits(wall_s=900, idle_s=120), activity=heartbeat)
        ...grade box.workspace...
    result.outcome  # "exited" | "timeout" | "idle" | "cancelled" | "spawn_failed"

`Sandbox` (`agents.sandbox.contract`) is the interface every backend implements (`agents.sandbox.namespace`,
`agents.sandbox.docker`).
`LocalSandbox` is the simplest: no isolation at all (the agent runs as this user, sees the host's files, network and
processes), for trusted programs and platforms without namespaces. It runs the agent as a process of this machine:
- its own session and process group, under the subreaper shim of `agents.sandbox.proctree` on Linux, so the whole tree
  (detached tool commands and orphans included) ends with the run, whatever the outcome;
- a wall-clock limit, and an idle watchdog: no output and no outside activity for `idle_s` (Pi waits forever on a
  stream that stalls after its headers, and prints nothing until it is done, so pass the server's activity);
- on timeout, idle or `stop`: SIGTERM to the tree, `kill_grace_s`, then SIGKILL; on cancellation of `run`
  itself: SIGKILL at once, then the `CancelledError` propagates;
- stdout and stderr kept as bounded tails with the launch's secrets replaced by `***`;
- only the host variables named in `passthrough_env` (PATH, locale) reach the agent, plus TMPDIR (its own);
  `bin_dir` comes first on PATH, for commands the runner gives the agent (e.g. `answer`);
- `warm()`: the next run's process (for the backends: its namespaces, container, bridge) started ahead, waiting for
  the launch on stdin (`agents.sandbox.proctree --launch-stdin`); the agent's argv and environment travel in that pipe,
  never in an argv. `agents.sandbox.pool` keeps warmed sandboxes ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from agents.errors import AgentConfigError
from agents.sandbox import proctree
from agents.sandbox.spare import Started, hand_launch, put_away, until_ready
from agents.sandbox.contract import Sandbox
from agents.sandbox.supervision import ExecResult, Heartbeat, Outcome, RunLimits, RunResult, Supervised, tree_bytes
from agents.specs.spec import AgentLaunch, Bind, BoxFile, write_box_files

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

_SHIM = Path(proctree.__file__)
_SPAWN_WAIT_S = 30.0  # for a spare being started when the sandbox is put away


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
    _inherited: tuple[str, ...] = ()  # variables a warm agent keeps from its spare's environment (the container's)
    binds_paths = False  # can show a host path at another path in the box (`AgentLaunch.binds`): not without its own

    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        self.config = config or LocalSandboxConfig()
        self._root: Path | None = None
        self._spare: Started | None = None  # the next run's process, started ahead (`warm`)
        self._warming: asyncio.Task | None = None
        self._keep_warm = False
        self.warm_starts = 0  # runs that started from a spare

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
    def script_python(self) -> str:
        """This interpreter, which the box shares (the namespace box binds its installation)."""
        return sys.executable

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def warm_ready(self) -> bool:
        """A spare process is up, waiting for the next run's launch."""
        return self._spare is not None and self._spare.process.returncode is None

    async def __aenter__(self) -> Self:
        parent = str(self.config.parent_dir) if self.config.parent_dir else None
        self._root = Path(tempfile.mkdtemp(prefix="interceptor-rollout-", dir=parent)).resolve()  # mode 0700
        for path in (self.workspace, self.home, self.bin_dir, self.tmp):
            path.mkdir(mode=0o700)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._put_away_spare()
        root, self._root = self._root, None
        if root is not None and not self.config.keep_dirs:
            await asyncio.to_thread(_remove_tree, root)

    async def warm(self) -> None:
        """Start the next run's process now (for the backends: its namespaces, container and network bridge), left
        waiting for its launch, so that `run` only hands it the agent's argv and environment. From then on the
        sandbox stays warm: when a run takes the spare, the next one is started in the background. A spare that
        does not fit a launch (another endpoint, a program the container lacks) is thrown away and the run starts
        cold. Without a subreaper shim (off Linux) there is nothing to start ahead, and this does nothing."""
        if not proctree.supports_subreaper():
            return
        self._keep_warm = True
        if self._spare is None:
            spare = await self._start(self._template(), self._launcher(), {}, waiting=True)
            try:
                await until_ready(spare)
            except BaseException:
                self._keep_warm = False  # a backend whose spares fail is not retried after every run
                await asyncio.shield(put_away(spare))
                raise
            self._spare = spare

    async def run(
        self,
        launch: AgentLaunch,
        *,
        limits: RunLimits,
        activity: Callable[[], float] | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult:
        started = time.monotonic()
        if launch.binds and not self.binds_paths:
            raise AgentConfigError(f"{type(self).__name__} cannot show host paths at paths of the box's own: "
                                   f"{', '.join(bind.target for bind in launch.binds)}")
        await self.put_files(launch.files)
        env = {key: os.environ[key] for key in self.config.passthrough_env if key in os.environ}
        env["PATH"] = os.pathsep.join(filter(None, [str(self.bin_dir), env.get("PATH", os.defpath)]))
        env = self._agent_env(launch, env | {"TMPDIR": str(self.tmp), **launch.env})
        program = self._program(launch, env)
        if program is None:
            return RunResult(outcome="spawn_failed", reason=f"{launch.argv[0]}: not found or not executable")
        egress_mark = (self._egress_count(), len(self._egress_refusals()))
        begun = await self._take_spare(launch)
        if begun is not None and not await hand_launch(begun, program, self._launch_env(launch, env), launch,
                                                        inherit=self._inherited):
            await put_away(begun)
            begun = None
        self.warm_starts += begun is not None
        try:
            if begun is None:
                try:
                    begun = await self._start(launch, self._shim(program), env, waiting=False)
                except OSError as exc:
                    return RunResult(outcome="spawn_failed", reason=f"{launch.argv[0]}: {exc.strerror or exc}")
            run = Supervised(begun.process, self.config, launch, started)
            root = str(self.root)
            outcome, reason = await run.supervise(limits, activity, stop, disk_usage=lambda: tree_bytes(root))
        finally:
            if begun is not None:
                # Shielded: a cancelled run still releases what it held (a container is removed even then).
                await asyncio.shield(begun.held.aclose())
        hits = {**begun.limits_hit, **run.limits_hit}
        if refused := self._egress_count() - egress_mark[0]:
            hits["egress"] = refused
        egress_refused = tuple((r.host, r.port, r.reason) for r in self._egress_refusals()[egress_mark[1]:])
        if self._keep_warm and self._root is not None:
            self._warming = asyncio.create_task(self.warm())
        stdout, stderr = run.stdout, run.stderr
        code = begun.process.returncode
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
            limits_hit=tuple(sorted(hits.items())),
            egress_refused=egress_refused,
        )

    async def exec(
        self, command: str, *, timeout_s: float, env: dict[str, str] | None = None, host_paths: tuple[Path, ...] = (),
        binds: tuple[Bind, ...] = (),
    ) -> ExecResult:
        """Run `sh -c command` in the workspace, inside the sandbox (the same isolation, limits and reaping as the
        agent), with a combined output tail. Set-up and graders use it, so what they run is confined like the
        agent (a grader runs code the agent wrote)."""
        launch = AgentLaunch(argv=("/bin/sh", "-c", f"exec 2>&1; {command}"), env=dict(env or {}), cwd=self.workspace,
                             host_paths=host_paths, binds=binds)
        result = await self.run(launch, limits=RunLimits(wall_s=timeout_s, idle_s=None))
        if result.outcome == "exited":
            return ExecResult(exit_code=result.exit_code, output=result.stdout)
        return ExecResult(exit_code=None, output=result.stdout, timed_out=result.outcome == "timeout",
                          reason=result.reason or result.outcome)

    async def put_files(self, files: tuple[BoxFile, ...]) -> None:
        """Written through this host's file system, which this box (and the namespace and Docker ones, whose rollout
        directory is the host's, bound) shares."""
        if files:
            await asyncio.to_thread(write_box_files, files, self.root)

    async def put_tree(self, source: Path) -> None:
        await asyncio.to_thread(shutil.copytree, source, self.workspace, symlinks=True, dirs_exist_ok=True)

    async def pull_workspace(self) -> None:
        """Nothing to do: the box's workspace is this host's directory."""

    async def push_workspace(self) -> None:
        """Nothing to do: the box's workspace is this host's directory."""

    # --------------------------------------------------------------------------- what a backend changes

    def _agent_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        """The agent's environment as it must be inside (a backend rewrites its endpoint's address)."""
        return env

    def _egress_count(self) -> int:
        """Connections the box's egress proxy refused so far (none here: the host's network is the box's)."""
        return 0

    def _egress_refusals(self) -> list:
        """The first of them, each an `agents.sandbox.egress.Refusal`, in order."""
        return []

    def _launch_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        """The whole environment a warm spare's agent gets (it replaces the spare's own)."""
        return env

    def _program(self, launch: AgentLaunch, env: dict[str, str]) -> list[str] | None:
        """The agent's argv with argv[0] found on its PATH (on the host here), or None when it is not there."""
        executable = shutil.which(launch.argv[0], path=env.get("PATH", os.defpath))
        return None if executable is None else [executable, *launch.argv[1:]]

    def _shim(self, program: list[str]) -> list[str]:
        """What is started for a cold run: the program under the subreaper shim, where there is one."""
        if not proctree.supports_subreaper():
            return program
        return [sys.executable, "-I", str(_SHIM), "--grace", str(self.config.kill_grace_s), "--", *program]

    def _launcher(self) -> list[str]:
        """What is started for a warm spare: the shim, waiting for its launch on stdin."""
        return [sys.executable, "-I", str(_SHIM), "--grace", str(self.config.kill_grace_s), "--launch-stdin"]

    def _template(self) -> AgentLaunch:
        """The launch a warm spare is started for (its endpoint, its mounts): runs that differ start cold."""
        return AgentLaunch(argv=("(warm)",), env={}, cwd=self.workspace)

    def _fits(self, launch: AgentLaunch, made_for: AgentLaunch) -> bool:
        """Whether a spare started for `made_for` can run `launch`."""
        return True

    def _hold(self, launch: AgentLaunch, hits: dict[str, int]) -> contextlib.AbstractAsyncContextManager[object]:
        """What one started process holds until it ends (a cgroup, a container); passed to `_wrap`. As it is
        released it counts into `hits` the limits the run ran into (a cgroup's refused forks, a bridge's refused
        connections)."""
        return contextlib.nullcontext()

    def _wrap(
        self, launch: AgentLaunch, argv: list[str], env: dict[str, str], held: object
    ) -> tuple[list[str], dict[str, str]]:
        """The command and environment actually started. A backend that runs the agent somewhere else (in its own
        namespaces: `agents.sandbox.namespace`) wraps them here and keeps the limits, watchdog and output above."""
        return argv, env

    # --------------------------------------------------------------------------- starting, and the spare

    async def _start(self, launch: AgentLaunch, argv: list[str], env: dict[str, str], *, waiting: bool) -> Started:
        held = AsyncExitStack()
        hits: dict[str, int] = {}
        try:
            state = await held.enter_async_context(self._hold(launch, hits))
            command, process_env = self._wrap(launch, argv, env, state)
            process = await asyncio.create_subprocess_exec(
                *command,
                cwd=launch.cwd,
                env=process_env,
                stdin=asyncio.subprocess.PIPE if waiting or launch.stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own session and group: no terminal signals from ours reach it
            )
        except BaseException:
            await asyncio.shield(held.aclose())
            raise
        return Started(process, held, made_for=launch if waiting else None, limits_hit=hits)

    async def _take_spare(self, launch: AgentLaunch) -> Started | None:
        """The warm spare, when there is one (or one on its way) that fits this launch."""
        if (warming := self._warming) is not None:
            try:
                await asyncio.shield(warming)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001  (a spare that could not start: this run starts cold, and says why)
                pass
            finally:
                if warming.done():
                    self._warming = None
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        assert spare.made_for is not None
        if spare.process.returncode is not None or not self._fits(launch, spare.made_for):
            await put_away(spare)
            return None
        return spare

    async def _put_away_spare(self) -> None:
        self._keep_warm = False
        warming, self._warming = self._warming, None
        if warming is not None:
            # Let a spare being started finish starting (cancelling a process's creation in asyncio waits for the
            # process to exit: bwrap's would not), then put it away below.
            with contextlib.suppress(Exception):
                await asyncio.wait([warming], timeout=_SPAWN_WAIT_S)
            if not warming.done():
                warming.cancel()
            await asyncio.gather(warming, return_exceptions=True)
        spare, self._spare = self._spare, None
        if spare is not None:
            await put_away(spare)


def _remove_tree(root: Path) -> None:
    """Remove a rollout's directory, including what an agent made read-only (chmod 000 directories, etc.)."""

    def make_writable_and_retry(function, path, _exc) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)

    shutil.rmtree(root, onerror=make_writable_and_retry)  # onexc needs Python 3.12
