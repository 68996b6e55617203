"""Supervising one started agent process: its output tails, its stdin, its limits and watchdog, and its ending.

`Supervised(process, config, launch, started).supervise(limits, activity, stop)` returns how the run ended, after
which nothing of the run's process tree is left (see `agents.sandbox.base` for the rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agents.errors import AgentConfigError
from agents.sandbox import proctree
from agents.sandbox.output import OutputTail
from agents.specs.spec import AgentLaunch

if TYPE_CHECKING:
    from agents.sandbox.base import LocalSandboxConfig

__all__ = ["ExecResult", "Heartbeat", "Outcome", "RunLimits", "RunResult", "Supervised", "tree_bytes"]

Outcome = Literal["exited", "timeout", "idle", "limit", "cancelled", "spawn_failed"]
_DRAIN_S = 2.0  # after the tree is gone, how long the output pipes get to reach EOF (a process that escaped the
# tree could hold them open forever)
_STDIN_CHUNK = 64 * 1024
_DISK_POLL_S = 2.0  # how often the rollout directory's size is measured (a walk of its tree, in a thread)


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    wall_s: float = 1800.0  # the whole run
    idle_s: float | None = 300.0  # no output and no outside activity for this long; None: no watchdog
    # What the run may write into its directory (workspace, home, tmp) on the host's disk: past it the run is ended
    # with outcome "limit" (a full disk would fail every other rollout's finish). None: unwatched.
    disk_bytes: int | None = 4 * 2**30

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise AgentConfigError("wall_s must be positive")
        if self.idle_s is not None and self.idle_s <= 0:
            raise AgentConfigError("idle_s must be positive (or None)")
        if self.disk_bytes is not None and self.disk_bytes <= 0:
            raise AgentConfigError("disk_bytes must be positive (or None)")


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
    # Limits the run ran into, by name ("memory", "pids", "disk", "connections"), with how often: each is an event
    # of the rollout; the one that ended the run is also its outcome ("limit").
    limits_hit: tuple[tuple[str, int], ...] = ()
    # Connections its egress proxy refused, (host, port, why), the first `agents.sandbox.egress.MAX_REFUSALS` of the
    # box's; all of them are counted in `limits_hit` as "egress".
    egress_refused: tuple[tuple[str, int, str], ...] = ()

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


class Supervised:
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
        self.limits_hit: dict[str, int] = {}

    async def supervise(
        self,
        limits: RunLimits,
        activity: Callable[[], float] | None,
        stop: asyncio.Event | None,
        disk_usage: Callable[[], int] | None = None,
    ) -> tuple[Outcome, str]:
        assert self.process.stdout is not None and self.process.stderr is not None
        pumps = [
            asyncio.create_task(self._pump(self.process.stdout, self.stdout)),
            asyncio.create_task(self._pump(self.process.stderr, self.stderr)),
        ]
        if self.launch.stdin is not None:
            pumps.append(asyncio.create_task(self._feed(self.launch.stdin)))
        try:
            verdict = await self._watch(limits, activity, stop, disk_usage)
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
        self,
        limits: RunLimits,
        activity: Callable[[], float] | None,
        stop: asyncio.Event | None,
        disk_usage: Callable[[], int] | None,
    ) -> tuple[Outcome, str]:
        deadline = self.started + limits.wall_s
        exited = asyncio.ensure_future(self.process.wait())
        stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
        over_disk = None
        if disk_usage is not None and limits.disk_bytes is not None:
            over_disk = asyncio.ensure_future(_until_over(disk_usage, limits.disk_bytes))
        try:
            while True:
                waiting = {f for f in (exited, stopping, over_disk) if f is not None}
                await asyncio.wait(waiting, timeout=self.config.poll_s, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    return "exited", ""
                now = time.monotonic()
                if stopping is not None and stopping.done():
                    return "cancelled", "stopped by the caller"
                if over_disk is not None and over_disk.done():
                    self.limits_hit["disk"] = 1
                    return "limit", f"disk: the run wrote {over_disk.result():,} bytes, over its {limits.disk_bytes:,}"
                if now >= deadline:
                    return "timeout", f"still running after the {limits.wall_s:g} s wall-clock limit"
                if limits.idle_s is not None:
                    seen = max(self.last_output, activity() if activity is not None else self.started)
                    if now - seen >= limits.idle_s:
                        return "idle", f"no output and no activity for {limits.idle_s:g} s"
        finally:
            for future in (exited, stopping, over_disk):
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


async def _until_over(disk_usage: Callable[[], int], limit: int) -> int:
    """Returns the usage once it is over `limit` (measured every `_DISK_POLL_S`, off the event loop)."""
    while True:
        await asyncio.sleep(_DISK_POLL_S)
        used = await asyncio.to_thread(disk_usage)
        if used > limit:
            return used


def tree_bytes(root: str) -> int:
    """The disk space a directory tree takes (allocated blocks, so a sparse file counts what it holds; each entry
    at least one block, so a million empty files count too). Entries that vanish while walking are skipped."""
    total = 0
    stack = [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += max(st.st_blocks * 512, 4096)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


async def _drain(pumps: list[asyncio.Task]) -> None:
    """Let the pumps read to EOF; a pipe still held open after the tree is gone (a process that left the tree by
    itself) is abandoned rather than waited on forever. Never raises: it runs while a cancellation unwinds."""
    _, pending = await asyncio.wait(pumps, timeout=_DRAIN_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
