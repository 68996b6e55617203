"""The sandbox: one rollout's place to run an agent, whatever the backend (`agents.sandbox.base` has the plain one).

A box's paths (`workspace`, `home`, `bin_dir`) are the same strings inside as on this host, where a copy is kept;
files go in through `put_files` and `put_tree`, and what the agent wrote comes to the host with `pull_workspace`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, Self

from agents.sandbox.supervision import ExecResult, RunLimits, RunResult
from agents.specs.spec import AgentLaunch, Bind, BoxFile

__all__ = ["Sandbox"]


class Sandbox(Protocol):
    """One rollout's place to run an agent. Entering creates the workspace and home; leaving removes them."""

    @property
    def workspace(self) -> Path: ...

    @property
    def home(self) -> Path: ...

    @property
    def bin_dir(self) -> Path: ...  # first on the agent's PATH

    @property
    def script_python(self) -> str: ...  # what runs the Python scripts written into the box (a shebang's program)

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
        self, command: str, *, timeout_s: float, env: dict[str, str] | None = None, host_paths: tuple[Path, ...] = (),
        binds: tuple[Bind, ...] = (),
    ) -> ExecResult:
        """Run a shell command in the workspace, inside the sandbox, as task set-up and graders do (`host_paths`:
        what it runs from on the host, for backends that do not share the host's file system; `binds`: host paths
        shown at other paths in the box, refused by a backend that cannot)."""
        ...

    async def put_files(self, files: tuple[BoxFile, ...]) -> None:
        """Make these files and directories in the box (each inside its directory), with their modes: what a
        launch needs (`AgentLaunch.files`, written by `run` itself) and what the runner gives the agent (`answer`)."""
        ...

    async def put_tree(self, source: Path) -> None:
        """Copy a directory of this host (a task's workspace) into the box's workspace, links as links."""
        ...

    async def warm(self) -> None:
        """Start what the next run needs ahead of it (a backend with nothing to start ahead does nothing)."""
        ...

    async def pull_workspace(self) -> None:
        """Bring what the box's workspace holds to the host path `workspace`, where host-side graders read it (a
        backend whose box shares this host's file system has nothing to do)."""
        ...

    async def push_workspace(self) -> None:
        """Make the box's workspace what the host path `workspace` holds (after a host-side grader changed it)."""
        ...
