"""A sandbox whose agent runs in its own Linux namespaces (bubblewrap), reaching nothing but its model endpoint.

    async with NamespaceSandbox(endpoint=("127.0.0.1", server_port)) as box:   # the interception server's address
        ...same use as LocalSandbox: box.workspace, box.home, box.bin_dir, await box.run(launch, limits=...)...

What the agent (and every tool command it runs) gets, per rollout, from `bwrap`:
- its own user, mount, PID, IPC, UTS, cgroup and network namespaces, all capabilities dropped, a new session (no
  terminal to inject into), and `--die-with-parent`;
- an allow-list of the host's file system, read-only, on an empty root: the system's programs and libraries (`/usr`
  and its `/bin`, `/sbin`, `/lib*` links), the few files of `/etc` that programs read to run (`_ETC`: users, name
  resolution, certificates, time zone, the dynamic linker's cache; not `shadow`, `ssh`, `sudoers`, ...), this
  interpreter's installation, the two scripts the sandbox runs from (`agents/sandbox/netbridge.py`, `agents/sandbox/proctree.py`,
  each bound alone), and what the launch runs from (`AgentLaunch.host_paths`: the agent's install, its interpreter).
  Nothing else of the host is there: no `/run` or `/var/run` (no host Unix socket: the Docker daemon's, D-Bus), no
  home directory, no project checkout, no task file, no record, journal or token file of any server;
- a fresh `/proc` (it sees only its own processes), a minimal `/dev`, an empty `/tmp` and `/var/tmp` (tmpfs, so
  charged to the run's memory limit), and this rollout's own directory (workspace, home, bin, tmp) writable at the
  same path, so the launch's paths stay valid and no other rollout's files are visible;
- loopback only: the model endpoint's port on 127.0.0.1 is forwarded to the host's interception server through a
  Unix socket in the rollout's directory (`agents.sandbox.netbridge`); every other port, the host's included, is closed.
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

A warm spare is started before its launch is known: it binds the allow-list plus `warm_paths` (the programs the
runner's agents ran from so far); a launch that needs a host path outside them starts cold (`_fits`).

Limits: every run gets `DEFAULT_LIMITS` (memory, processes) in a cgroup of its own where this machine lets us make
one, unless `resources` says otherwise (`ResourceLimits()` for none); the rollout directory's size is watched by the
supervisor (`RunLimits.disk_bytes`); the host half of the bridge caps the connections a box holds open to its endpoint
and forwards only `/rollout/...` requests (`agents.sandbox.netbridge`), so `/metrics`, `/health` and the admin routes are not
reachable from inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Self

from agents.errors import AgentConfigError, AgentError
from agents.sandbox import netbridge, proctree
from agents.sandbox.base import LocalSandboxConfig
from agents.sandbox.bridged import BridgedSandbox
from agents.sandbox.egress import EgressPolicy
from agents.sandbox.cgroups import DEFAULT_LIMITS, Cgroup, ResourceLimits, cgroups_unavailable
from agents.specs.spec import AgentLaunch

__all__ = ["NamespaceSandbox", "SandboxUnavailable", "namespaces_unavailable"]

_BRIDGE = Path(netbridge.__file__).resolve()
log = logging.getLogger("agents.sandbox.namespace")
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
    binds_paths = True
    def __init__(
        self,
        config: LocalSandboxConfig | None = None,
        *,
        endpoint: tuple[str, int] | None = None,
        bwrap: str = "bwrap",
        hidden: tuple[Path, ...] = (),
        network: str = "model",
        resources: ResourceLimits | None = None,
        warm_paths: tuple[Path, ...] = (),
        egress: EgressPolicy | None = None,
    ) -> None:
        """`hidden`: host directories the agent must not see even where one lies inside an allowed path (a record
        directory inside the interpreter's tree), each replaced by an empty tmpfs. `network`: "model" (loopback and
        the model endpoint only) or "open" (the host's network: a task that says so, e.g. one whose set-up installs
        packages). `egress`: destinations the model-only network reaches besides the model, through the box's proxy
        (`agents.sandbox.egress`). `resources`: memory, pids and CPU limits of each run (a cgroup of its own,
        `agents.sandbox.cgroups`); None: `DEFAULT_LIMITS` where this machine can set them; `ResourceLimits()`: none.
        Limits asked for explicitly that this machine cannot set are refused, never dropped. `warm_paths`: host paths
        a warm spare binds besides the allow-list (the programs agents run from), so that their launches start
        warm."""
        self.resources = _resources(resources)
        config = config or LocalSandboxConfig()
        parent = (config.parent_dir or default_parent_dir()).resolve()
        for needed in (Path(sys.executable).resolve(), _BRIDGE.resolve(), Path(proctree.__file__).resolve()):
            if needed.is_relative_to(parent):
                raise AgentConfigError(f"parent_dir {parent} would hide {needed} from the sandbox: use a dedicated one")
        super().__init__(dataclasses.replace(config, parent_dir=parent), endpoint=endpoint, network=network,
                         egress=egress)  # fmt: skip
        self.bwrap = bwrap
        self.warm_paths = tuple(Path(p).resolve() for p in warm_paths)  # read by `BridgedSandbox._template`
        needed = _runs_from()
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
    async def _hold(self, launch: AgentLaunch, hits: dict[str, int]) -> AsyncIterator[_Held]:
        port, socket = await self._bridge(launch)
        proxy_port, proxy_socket = await self._egress_bridge(launch)
        cgroup = await asyncio.to_thread(Cgroup.create, self.resources) if self.resources is not None else None
        refused = self._refused()
        try:
            yield _Held(port=port, socket=socket, proxy_port=proxy_port, proxy_socket=proxy_socket, cgroup=cgroup)
        finally:
            if refused_now := self._refused() - refused:
                hits["connections"] = refused_now
            if cgroup is not None:
                hits.update(await asyncio.to_thread(cgroup.events))
                await asyncio.to_thread(cgroup.remove)

    def _host_view(self, launch: AgentLaunch) -> list[Path]:
        return self._binds(launch)

    def _binds(self, launch: AgentLaunch) -> list[Path]:
        """The host paths bound read-only for `launch`, parents before children, none inside another or inside the
        rollout's directory (bound writable already)."""
        wanted = {*_system_paths(), *_runs_from(), *(Path(p).resolve() for p in launch.host_paths)}
        kept: list[Path] = []
        for path in sorted(wanted, key=lambda p: (len(p.parts), str(p))):
            if (os.path.lexists(path) and not path.is_relative_to(self.root)
                    and not any(path.is_relative_to(k) for k in kept)):
                kept.append(path)
        return kept

    def _links(self) -> tuple[tuple[str, str], ...]:
        """(link, target) of the root's symbolic links to the system's directories (a merged /usr's /bin)."""
        return _root_links()

    def _wrap(
        self, launch: AgentLaunch, argv: list[str], env: dict[str, str], held: object
    ) -> tuple[list[str], dict[str, str]]:
        assert isinstance(held, _Held)
        parent = self.config.parent_dir
        assert parent is not None
        binds = self._binds(launch)
        command = [
            shutil.which(self.bwrap) or self.bwrap,
            "--unshare-all",  # user, mount, pid, ipc, uts, cgroup and network ...
            *(["--share-net"] if self.network == "open" else []),  # ... unless the task opens the network
            "--unshare-user",  # required, not just tried: without it the agent would hold our capabilities
            "--cap-drop", "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname", "sandbox",
            # An empty root with the allow-list bound read-only: no `--ro-bind / /`, which left every host Unix socket
            # connectable (a read-only mount does not stop connect()) and every host file readable.
            *[arg for path in binds if not path.is_relative_to("/tmp") for arg in _bind_args(path)],
            *[arg for link, target in self._links() for arg in ("--symlink", target, link)],
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            "--tmpfs", "/var/tmp",
            # what lives under /tmp (a clone, a venv) is bound once /tmp is the box's own
            *[arg for path in binds if path.is_relative_to("/tmp") for arg in _bind_args(path)],
            *[arg for path in self.hidden if any(path.is_relative_to(b) for b in binds)
              for arg in ("--tmpfs", str(path))],  # e.g. a record directory inside an allowed tree
            "--tmpfs", str(parent),  # every rollout's directory hidden (a no-op twice over when under /tmp) ...
            "--bind", str(self.root), str(self.root),  # ... but this one's, writable at the same path
            *[arg for bind in launch.binds
              for arg in ("--bind" if bind.writable else "--ro-bind", str(bind.source), bind.target)],
            "--chdir", str(launch.cwd),
            "--",
        ]  # fmt: skip
        if held.port is not None:
            command += [sys.executable, "-I", str(_BRIDGE), "--port", str(held.port), "--unix", str(held.socket), "--"]
        if held.proxy_port is not None:  # the egress proxy: a second bridge, on its own port
            command += [sys.executable, "-I", str(_BRIDGE), "--port", str(held.proxy_port), "--unix",
                        str(held.proxy_socket), "--"]  # fmt: skip
        command = [*command, *argv]
        if held.cgroup is not None:  # bwrap and everything it starts run in the run's cgroup
            command = held.cgroup.enter_argv(command)
        return command, env


@dataclasses.dataclass(frozen=True)
class _Held:
    port: int | None  # the model endpoint's port, forwarded inside
    socket: str | None  # the host half of its bridge
    proxy_port: int | None  # the egress proxy's port inside; None: no egress list
    proxy_socket: str | None  # its host half
    cgroup: Cgroup | None


# The system's programs and libraries: bound whole. Top-level links to them (a merged /usr's /bin -> usr/bin) are
# made as links (`_root_links`).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc to run, and nothing more: users and groups (names for ids), name resolution,
# certificates, time zone, the dynamic linker's cache, shells' and git's system settings, Debian's alternatives
# links (`python3`, `awk`, `editor` resolve through them). Not shadow files, ssh keys, sudoers, package manager
# credentials or anything a service keeps there.
_ETC = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version", "environment",
    "gai.conf", "gitconfig", "group", "host.conf", "hostname", "hosts", "inputrc", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "locale.alias", "localtime", "magic", "magic.mime", "mime.types", "networks", "nsswitch.conf",
    "os-release", "passwd", "pki", "profile", "protocols", "python3", "resolv.conf", "services", "shells", "ssl",
    "terminfo", "timezone",
)  # fmt: skip


@functools.cache
def _root_links() -> tuple[tuple[str, str], ...]:
    """(link, target) for each of `_SYSTEM_DIRS` that is a symbolic link on the host."""
    return tuple((d, os.readlink(d)) for d in _SYSTEM_DIRS if os.path.islink(d))


@functools.cache
def _system_paths() -> tuple[Path, ...]:
    """The system part of the allow-list, as it exists on this host."""
    dirs = [Path(d) for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    etc = [Path("/etc", name) for name in _ETC if os.path.lexists(Path("/etc", name))]
    return (*dirs, *etc)


def _bind_args(path: Path) -> tuple[str, ...]:
    """A read-only bind of `path` at the same place; a symbolic link (in /etc: localtime, os-release) stays a link,
    so that it resolves inside as on the host."""
    if path.is_symlink():
        return ("--symlink", os.readlink(path), str(path))
    return ("--ro-bind", str(path), str(path))


@functools.cache
def _runs_from() -> tuple[Path, ...]:
    """Host paths the sandbox itself runs from: this interpreter's installation (and its base), and the two scripts
    it starts inside (the process-tree shim and the network bridge), each alone: not the project around them."""
    candidates = {Path(sys.prefix), Path(sys.base_prefix), _BRIDGE, Path(proctree.__file__)}
    return tuple(sorted(p.resolve() for p in candidates if p.exists()))


def _resources(asked: ResourceLimits | None) -> ResourceLimits | None:
    """The limits each run gets: those asked for (refused when this machine cannot set them), or by default
    `DEFAULT_LIMITS` where it can (said once where it cannot)."""
    if asked is None:
        why = cgroups_unavailable()
        if why is None:
            return DEFAULT_LIMITS
        _warn_unlimited(why)
        return None
    if asked.any and (why := cgroups_unavailable()) is not None:
        raise AgentConfigError(f"resource limits cannot be set here: {why}")
    return asked if asked.any else None


@functools.cache
def _warn_unlimited(why: str) -> None:
    log.warning("sandboxes run without their default memory and process limits: %s", why)
