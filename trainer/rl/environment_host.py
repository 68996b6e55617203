"""The sandboxes behind `trainer.rl.environment`: one background event loop per process, a warm pool, and each
episode's sandbox opened, prepared and released on that loop.

TRL calls an environment synchronously from the trainer's thread; the sandboxes (`agents.sandbox.base`,
`agents.sandbox.namespace`, `agents.sandbox.docker`) are asyncio objects bound to the loop that made them. So a
`SandboxHost` runs one loop on a daemon thread, and every sandbox operation is a coroutine submitted to it
(`host.call(coro)`). `SandboxHost.shared()` is the process's host, closed by `atexit`; tests make their own.

Which sandbox a task gets is the runner's choice (`agents.sandbox.backends`, `auto`), less the model endpoint (here the model
runs in the trainer, so the sandbox reaches nothing): a task with an `image` runs in a `DockerSandbox` of it; else a
`NamespaceSandbox` without network (the host's network when the task says `"network": "open"`) where bubblewrap
works; else a `LocalSandbox`, with a warning (no isolation). The workspace is prepared as the runner prepares it
(the task's `workspace` copied, its `files` written, its `setup` run inside the sandbox), and an `answer` command is
put first on PATH: it records the value in the sandbox's bin directory, where the environment reads it back. For a
task graded fresh (`grading.where`, the default) the prepared workspace is remembered (`OpenedSandbox.base`), and
`fresh_box(task)` makes the boxes it is graded in, as the runner does (`agents.grading.fresh`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import shlex
import threading
from collections.abc import Callable, Coroutine, Hashable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agents.errors import AgentError
from agents.graders import GRADER_PATHS
from agents.grading.changes import Entry
from agents.grading.fresh import baseline, graded_fresh
from agents.workspace import SetupFailed, prepare_workspace
from agents.sandbox.backends import BoxChooser, Placement
from agents.sandbox.base import Sandbox
from agents.sandbox.cgroups import ResourceLimits
from agents.sandbox.pool import PoolConfig, SandboxPool
from agents.specs.spec import BoxFile
from agents.tasks import Task

__all__ = ["ANSWER_FILE", "OpenedSandbox", "SandboxFailed", "SandboxHost"]

log = logging.getLogger("trainer.rl.environment")

T = TypeVar("T")

ANSWER_FILE = ".answer"  # in the sandbox's bin directory: written by its `answer` command
_CLOSE_TIMEOUT_S = 60.0  # releasing every sandbox at exit: a container removal can take seconds

_ANSWER_SCRIPT = """#!/bin/sh
# Submit the answer for this task: answer <value> (or the value on stdin). Written by interceptor for one episode.
if [ "$#" -gt 0 ]; then printf '%s' "$*" > {tmp}; else cat > {tmp}; fi && mv -f {tmp} {path} && echo "answer recorded"
"""


class SandboxFailed(Exception):
    """An episode's sandbox could not be made or prepared (an infrastructure fault: its reward is None)."""


@dataclass(frozen=True, slots=True, eq=False)
class OpenedSandbox:
    box: Sandbox
    stack: AsyncExitStack  # closing it throws the sandbox away
    base: dict[str, Entry] | None = None  # the prepared workspace, for a task graded in a fresh box; None: in place

    @property
    def answer_path(self) -> Path:
        return self.box.bin_dir / ANSWER_FILE


class SandboxHost:
    """One event loop thread and one warm pool; every episode's sandbox lives on them."""

    _shared: SandboxHost | None = None
    _shared_lock = threading.Lock()

    def __init__(
        self,
        *,
        sandbox: Callable[[], Sandbox] | None = None,
        pool: PoolConfig | None = None,
        resources: ResourceLimits | None = None,
        setup_timeout_s: float = 300.0,
    ) -> None:
        """`sandbox`: how to make every episode's sandbox (None: by task, as the runner chooses)."""
        self._sandbox = sandbox
        # the runner's choice, less the model endpoint (the model is outside the box: TRL calls the tools)
        self._boxes = None if sandbox is not None else BoxChooser(
            "auto", Placement(resources=resources, warm_paths=lambda: GRADER_PATHS))
        self.setup_timeout_s = setup_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="interceptor-environments", daemon=True)
        self._thread.start()
        self._pool = SandboxPool(pool or PoolConfig())
        self._open: set[OpenedSandbox] = set()
        self._releasing: set[asyncio.Future] = set()  # releases under way (a finaliser's are not awaited by anyone)
        self._closed = False
        self.call(self._pool.__aenter__())

    @classmethod
    def shared(cls) -> SandboxHost:
        """The process's host (made on first use, closed at exit)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared.closed:
                cls._shared = cls()
                atexit.register(cls._shared.close)
            return cls._shared

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_sandboxes(self) -> int:
        return len(self._open)

    def call(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run `coro` on the host's loop and wait for its result (from any thread but the loop's own)."""
        if self._closed:
            coro.close()
            raise RuntimeError("the sandbox host is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def call_soon(self, coro: Coroutine[Any, Any, object]) -> None:
        """Start `coro` on the host's loop without waiting (a finaliser's release)."""
        if self._closed or not self._loop.is_running():
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def open(self, task: Task) -> OpenedSandbox:
        """A sandbox for `task`, its workspace prepared and its `answer` command in place; on failure nothing of it
        is left and `SandboxFailed` says why."""
        stack = AsyncExitStack()
        try:
            try:
                box = await stack.enter_async_context(self._pool.sandbox(*self._sandbox_for(task)))
            except AgentError as exc:  # the backend cannot make a sandbox here (bwrap missing, image absent)
                raise SandboxFailed(f"the sandbox could not be made: {exc}") from exc
            await self._prepare_workspace(task, box)
            base = await baseline(box) if graded_fresh(task) else None
            await box.put_files((_answer_command(box.bin_dir),))
        except BaseException:
            await asyncio.shield(stack.aclose())
            raise
        opened = OpenedSandbox(box=box, stack=stack, base=base)
        self._open.add(opened)
        return opened

    def fresh_box(self, task: Task) -> Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]:
        """How a box to grade `task` in is made: one of its own kind, from the pool."""
        return lambda: self._pool.sandbox(*self._sandbox_for(task))

    async def release(self, opened: OpenedSandbox) -> None:
        """Throw the sandbox away (its directories and every process it started). Idempotent."""
        if opened in self._open:
            self._open.discard(opened)
            releasing = asyncio.ensure_future(opened.stack.aclose())
            self._releasing.add(releasing)
            releasing.add_done_callback(self._releasing.discard)
            await asyncio.shield(releasing)

    def close(self) -> None:
        """Release every open sandbox and the pool, and stop the loop. Idempotent."""
        if self._closed:
            return

        async def release_all() -> None:
            for opened in list(self._open):
                await self.release(opened)
            await asyncio.gather(*self._releasing, return_exceptions=True)
            await self._pool.__aexit__(None, None, None)

        try:
            asyncio.run_coroutine_threadsafe(release_all(), self._loop).result(_CLOSE_TIMEOUT_S)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CLOSE_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    # ------------------------------------------------------------------ as agents.runner does, without a server

    def _sandbox_for(self, task: Task) -> tuple[Hashable, Callable[[], Sandbox]]:
        """The kind of sandbox a task runs in (the pool's key) and how to make one."""
        if self._boxes is None:
            return ("custom",), self._sandbox
        return self._boxes(task.image, task.network, task.egress, task.workdir)

    async def _prepare_workspace(self, task: Task, box: Sandbox) -> None:
        try:
            await prepare_workspace(task, box, setup_timeout_s=self.setup_timeout_s)
        except SetupFailed as exc:
            raise SandboxFailed(str(exc)) from exc


def _answer_command(bin_dir: Path) -> BoxFile:
    """`bin_dir/answer`, run by /bin/sh (present in every image), writing its value to `bin_dir/.answer`."""
    script = _ANSWER_SCRIPT.format(tmp=shlex.quote(str(bin_dir / (ANSWER_FILE + ".tmp"))),
                                   path=shlex.quote(str(bin_dir / ANSWER_FILE)))
    return BoxFile(bin_dir / "answer", script.encode(), 0o700)
