"""Per-run resource limits for sandboxes whose processes run on this machine (the namespace backend): one cgroup
per run, with a memory, a pids and a CPU limit.

    group = Cgroup.create(limits)            # None when this machine gives us no usable cgroup controllers
    argv = group.enter_argv(argv)            # the command joins the group before it execs: so do its children
    ...run it...
    group.remove()

cgroup v2 is used where its controllers are enabled at the root (`/sys/fs/cgroup/cgroup.controllers`); otherwise
the v1 hierarchies `memory`, `pids` and `cpu` that this machine mounts. A limit whose controller is absent is
refused at `create` (a limit is never silently dropped). Needs write access to the cgroup file system (root, or a
delegated subtree).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from agents.errors import AgentConfigError

__all__ = ["DEFAULT_LIMITS", "Cgroup", "ResourceLimits", "cgroups_unavailable"]

_ROOT = Path("/sys/fs/cgroup")
_PARENT = "interceptor"  # our groups live under this one in each hierarchy
_CPU_PERIOD_US = 100_000
_REMOVE_S = 5.0  # processes of an ended run may take a moment to leave the group


@dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """Limits of one run; None leaves one unlimited."""

    cpus: float | None = None  # CPU time, in cores
    memory_bytes: int | None = None  # memory and swap together
    pids: int | None = None  # processes and threads

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_bytes", "pids"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise AgentConfigError(f"{name} must be positive (or None)")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.cpus, self.memory_bytes, self.pids))


# Every run's limits unless the caller sets its own: room for an agent (Node ~200 MB, a test suite, a compiler) and
# its threads (pids counts threads: a Node or Bun process starts a dozen), not for a fork bomb or a runaway
# allocation that takes the host (and every other rollout) down. CPU is shared, not capped, by default.
DEFAULT_LIMITS = ResourceLimits(memory_bytes=4 * 2**30, pids=1024)


def _v2() -> bool:
    controllers = _ROOT / "cgroup.controllers"
    return controllers.is_file() and {"memory", "pids", "cpu"} <= set(controllers.read_text().split())


def cgroups_unavailable() -> str | None:
    """Why no limits can be set here, or None."""
    if _v2():
        return None if os.access(_ROOT, os.W_OK) else f"{_ROOT} is not writable"
    missing = [c for c in ("memory", "pids", "cpu") if not (_ROOT / c / "cgroup.procs").is_file()]
    if missing:
        return f"no cgroup v2 controllers and no v1 hierarchies for {missing}"
    if not all(os.access(_ROOT / c, os.W_OK) for c in ("memory", "pids", "cpu")):
        return "the cgroup hierarchies are not writable"
    return None


class Cgroup:
    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories  # one per hierarchy (v1), or the one group (v2)

    @classmethod
    def create(cls, limits: ResourceLimits) -> Cgroup:
        reason = cgroups_unavailable()
        if reason is not None:
            raise AgentConfigError(f"resource limits cannot be set here: {reason}")
        name = f"run-{secrets.token_hex(6)}"
        if _v2():
            group = _make(_ROOT / _PARENT, name, enable=("memory", "pids", "cpu"))
            if limits.memory_bytes is not None:
                (group / "memory.max").write_text(str(limits.memory_bytes))
                with contextlib.suppress(FileNotFoundError):
                    (group / "memory.swap.max").write_text("0")
            if limits.pids is not None:
                (group / "pids.max").write_text(str(limits.pids))
            if limits.cpus is not None:
                (group / "cpu.max").write_text(f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
            return cls([group])
        groups = []
        if limits.memory_bytes is not None:
            group = _make(_ROOT / "memory" / _PARENT, name)
            (group / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError, PermissionError, OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
            groups.append(group)
        if limits.pids is not None:
            group = _make(_ROOT / "pids" / _PARENT, name)
            (group / "pids.max").write_text(str(limits.pids))
            groups.append(group)
        if limits.cpus is not None:
            group = _make(_ROOT / "cpu" / _PARENT, name)
            (group / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * _CPU_PERIOD_US)))
            groups.append(group)
        return cls(groups)

    def enter_argv(self, argv: list[str]) -> list[str]:
        """`argv` started by a shell that first moves itself into the group, then execs it (same pid)."""
        procs = " ".join(f"'{d / 'cgroup.procs'}'" for d in self.directories)
        script = f'for f in {procs}; do echo $$ > "$f" || exit 125; done; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *argv]

    def events(self) -> dict[str, int]:
        """How often the run ran into each limit: "memory" (processes killed for memory) and "pids" (forks refused).
        Read before `remove`."""
        counts = {"memory": 0, "pids": 0}
        for directory in self.directories:
            for file, key, name in (("memory.events", "oom_kill", "memory"), ("memory.oom_control", "oom_kill", "memory"),
                                    ("pids.events", "max", "pids")):
                with contextlib.suppress(OSError, ValueError):
                    for line in (directory / file).read_text().splitlines():
                        field, _, value = line.partition(" ")
                        if field == key:
                            counts[name] += int(value)
        return {name: count for name, count in counts.items() if count}

    def remove(self) -> None:
        """Remove the group once its processes are gone (they are: the run's tree has ended)."""
        deadline = time.monotonic() + _REMOVE_S
        for directory in self.directories:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still busy for a moment
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)


def _make(parent: Path, name: str, *, enable: tuple[str, ...] = ()) -> Path:
    parent.mkdir(exist_ok=True)
    if enable:  # v2: our parent passes the controllers on to its children
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in enable))
    group = parent / name
    group.mkdir()
    return group
