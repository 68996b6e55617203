"""A sandbox whose agent runs in its own Linux namespaces (bubblewrap), reaching nothing but its model endpoint.

    async with NamespaceSandbox(endpoint=("127.0.0.1", server_port)) as box:   # the interception server's address
        ...same use as LocalSandbox: box.workspace, box.home, box.bin_dir, await box.run(launch, limits=...)...

What the agent (and every tool command it runs) gets, per rollout, from `bwrap`:
- its own user, mount, PID, IPC, UTS, cgroup and network namespaces, all capabilities dropped, a new session (no
  terminal to inject into), and `--die-with-parent`;
- the host file system read-only (`/` bound read-only), a fresh `/proc` (it sees only its own processes), a minimal
  `/dev`, an empty `/tmp`; the sandboxes' parent directory (a dedicated one, `$TMPDIR/interceptor-sandboxes` by
  default) is an empty tmpfs, with only this rollout's own directory (workspace, home, bin, tmp) bound back
  writable at the same path, so the launch's paths stay valid and no other rollout's files are visible;
- loopback only: the model endpoint's port on 127.0.0.1 is forwarded to the host's interception server through a
  Unix socket in the rollout's directory (`agents.netbridge`); every other port, the host's included, is closed.
  The endpoint is `endpoint=(host, port)`, or else taken from the launch's `OPENAI_BASE_URL`; without either the
  sandbox has no network at all. Inside, the endpoint is always 127.0.0.1: an `OPENAI_BASE_URL` naming another host
  (`localhost`, a LAN address) is rewritten to 127.0.0.1 in the agent's environment. A URL an agent spec wrote into
  a config file is not rewritten, so give the agent a 127.0.0.1 base URL (the server's default) or `localhost`.
  The port must be 1024 or above: the forwarder binds it without privileges. An endpoint that is down looks, from
  inside, like a server that closes the connection without a reply.

The process tree, limits, idle watchdog and output tails are `LocalSandbox`'s: the agent runs under the same
subreaper inside the namespace, so what it leaves running ends when it exits. The PID namespace is the backstop:
when bwrap goes (killed, or its parent, us, dies) the kernel kills every process in it, escaped ones included.
SIGTERM ends bwrap at once, so a timed-out agent gets no grace period here: its directories are thrown away anyway.

`warm()` starts the next run's bwrap, bridge and shim ahead, waiting for the launch (`LocalSandbox.warm`).

Limits: on a host where the trainer runs as root, the sandbox's user maps to root, so the agent can *read* every
root-readable file of the host file system it sees (nothing of other rollouts: those are not mounted); run as an
unprivileged user to narrow that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Self

from . import netbridge, proctree
from .cgroups import Cgroup, ResourceLimits, cgroups_unavailable
from .errors import AgentConfigError, AgentError
from .bridged import BridgedSandbox
from .sandbox import LocalSandboxConfig
from .spec import AgentLaunch

__all__ = ["NamespaceSandbox", "SandboxUnavailable", "namespaces_unavailable"]

_BRIDGE = Path(netbridge.__file__)
_PROBE_S = 10.0


class SandboxUnavailable(AgentError):
    """This machine cannot make the sandbox (no bwrap, or user namespaces refused); the message says which."""


@functools.cache
def namespaces_unavailable(bwrap: str = "bwrap") -> str | None:
    """Why a namespace sandbox cannot be made here, or None when it can. Probed once per process."""
    if not sys.platform.startswith("linux"):
        return "namespaces are Linux only"
    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} is not installed (scripts/setup-sandbox.sh installs bubblewrap)"
    probe = [path, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
             "--dev", "/dev", "--", "true"]  # fmt: skip
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=_PROBE_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not be run: {exc}"
    if done.returncode != 0:
        return f"{bwrap} cannot make namespaces here (user namespaces refused?): {done.stderr.strip()}"
    return None


def default_parent_dir() -> Path:
    """A directory that holds sandboxes and nothing else: it is hidden wholesale inside every sandbox."""
    return Path(tempfile.gettempdir()).resolve() / "interceptor-sandboxes"


class NamespaceSandbox(BridgedSandbox):
    def __init__(
        self,
        config: LocalSandboxConfig | None = None,
        *,
        endpoint: tuple[str, int] | None = None,
        bwrap: str = "bwrap",
        hidden: tuple[Path, ...] = (),
        network: str = "model",
        resources: ResourceLimits | None = None,
    ) -> None:
        """`hidden`: host directories the agent must not see (the server's record and journal directory: other
        rollouts' trajectories), each replaced by an empty tmpfs unless it holds something the sandbox needs.
        `network`: "model" (loopback and the model endpoint only) or "open" (the host's network: a task that
        says so, e.g. one whose set-up installs packages). `resources`: memory, pids and CPU limits of each run (a
        cgroup of its own, `agents.cgroups`); a machine that cannot set them refuses them, never drops them."""
        if resources is not None and resources.any and (why := cgroups_unavailable()) is not None:
            raise AgentConfigError(f"resource limits cannot be set here: {why}")
        self.resources = resources if resources is not None and resources.any else None
        self._cgroup: Cgroup | None = None
        config = config or LocalSandboxConfig()
        parent = (config.parent_dir or default_parent_dir()).resolve()
        for needed in (Path(sys.executable).resolve(), _BRIDGE.resolve(), Path(proctree.__file__).resolve()):
            if needed.is_relative_to(parent):
                raise AgentConfigError(f"parent_dir {parent} would hide {needed} from the sandbox: use a dedicated one")
        super().__init__(dataclasses.replace(config, parent_dir=parent), endpoint=endpoint, network=network)
        self.bwrap = bwrap
        needed = _needed_paths()
        self.hidden = tuple(
            h for h in (Path(p).resolve() for p in hidden) if not any(n.is_relative_to(h) for n in needed)
        )

    async def __aenter__(self) -> Self:
        reason = namespaces_unavailable(self.bwrap)
        if reason is not None:
            raise SandboxUnavailable(reason)
        assert self.config.parent_dir is not None
        self.config.parent_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        entered = await super().__aenter__()
        self._open_bridges()
        return entered

    def _launch_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        return {**env, "PWD": str(launch.cwd)}  # what bwrap --chdir sets for a cold run

    @contextlib.asynccontextmanager
    async def _hold(self, launch: AgentLaunch) -> AsyncIterator[_Held]:
        port, socket = await self._bridge(launch)
        cgroup = await asyncio.to_thread(Cgroup.create, self.resources) if self.resources is not None else None
        try:
            yield _Held(port=port, socket=socket, cgroup=cgroup)
        finally:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)

    def _wrap(
        self, launch: AgentLaunch, argv: list[str], env: dict[str, str], held: object
    ) -> tuple[list[str], dict[str, str]]:
        assert isinstance(held, _Held)
        parent = self.config.parent_dir
        assert parent is not None
        command = [
            shutil.which(self.bwrap) or self.bwrap,
            "--unshare-all",  # user, mount, pid, ipc, uts, cgroup and network ...
            *(["--share-net"] if self.network == "open" else []),  # ... unless the task opens the network
            "--unshare-user",  # required, not just tried: without it the agent would hold our capabilities
            "--cap-drop", "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname", "sandbox",
            "--ro-bind", "/", "/",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            # ... but what the sandbox runs from, when it lives under /tmp (a clone, a venv), read-only again
            *[arg for path in _needed_paths() if path.is_relative_to("/tmp") for arg in ("--ro-bind", str(path), str(path))],
            *[arg for path in self.hidden for arg in ("--tmpfs", str(path))],  # e.g. other rollouts' records
            "--tmpfs", str(parent),  # every rollout's directory hidden (a no-op twice over when under /tmp) ...
            "--bind", str(self.root), str(self.root),  # ... but this one's, writable at the same path
            "--chdir", str(launch.cwd),
            "--",
        ]  # fmt: skip
        if held.port is not None:
            command += [sys.executable, "-I", str(_BRIDGE), "--port", str(held.port), "--unix", str(held.socket), "--"]
        command = [*command, *argv]
        if held.cgroup is not None:  # bwrap and everything it starts run in the run's cgroup
            command = held.cgroup.enter_argv(command)
        return command, env


@dataclasses.dataclass(frozen=True)
class _Held:
    port: int | None  # the model endpoint's port, forwarded inside
    socket: str | None  # the host half of its bridge
    cgroup: Cgroup | None


@functools.cache
def _needed_paths() -> tuple[Path, ...]:
    """Host paths the sandbox runs from: this interpreter and its base, and the project (the process-tree shim and
    the network bridge are run from it)."""
    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parent.parent}
    return tuple(sorted(p.resolve() for p in candidates if p.exists()))
