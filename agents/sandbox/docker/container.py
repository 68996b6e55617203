"""A sandbox whose agent runs in a Docker container of the task's image, reaching nothing but its model endpoint.

    async with DockerSandbox(image="interceptor/debian-python:bookworm", endpoint=("127.0.0.1", server_port)) as box:
        ...same use as LocalSandbox: box.workspace, box.home, box.bin_dir, await box.run(launch, limits=...)...

For tasks that come with an image (SWE-Gym ships one per instance). Each `run` (and so each `exec`) is one
`docker run --rm` of `image`, named per run and labelled `interceptor.sandbox=1`:
- the rollout's directory (workspace, home, bin, tmp) bind-mounted writable at the same path, so the launch's paths
  stay valid; `mounts` (agent binaries: `~/.cache/interceptor/agents`, `/usr/bin/node`) bound read-only at the same
  path; nothing else of the host, and nothing of other rollouts;
- `--network none`: loopback only. The model endpoint's port on 127.0.0.1 is forwarded to the host's interception
  server through a Unix socket in the rollout's directory (`agents.sandbox.netbridge`, as in `agents.sandbox.namespace`),
  so every other port, the host's included, is closed. The in-container half of the bridge runs on the image's
  `python` (3.11 or later: it uses `asyncio.TaskGroup`); an image without one runs with `endpoint` unset (no network
  at all), or gets one through `mounts` and `python=`;
- the host user's uid:gid, all capabilities dropped, `no-new-privileges`, `--init` (tini as PID 1 reaps orphans;
  when the agent exits, the container and every process left in it end), memory and pids limits (by default
  `agents.sandbox.cgroups.DEFAULT_LIMITS`; `limits=ContainerLimits()` for none);
- the environment passed as `-e KEY` with the value in the docker client's environment, so no value (the secret
  included) is in an argv; PATH is `bin_dir` then the image's own PATH (a launch that sets PATH keeps its own).

`argv[0]` is looked up in the image, not on the host. The limits, idle watchdog and output tails are
`LocalSandbox`'s, applied to the docker client: SIGTERM reaches the agent through the client's signal proxy, then the
grace period, then SIGKILL. Whatever the outcome (cancellation included), the container is then removed with
`docker rm -f`, which ends all its processes. A trainer killed outright leaves containers behind: they carry the
label, and `remove_stale_containers()` removes them.

What an image needs: `/bin/sh` (set-up and graders run through `exec`), python 3.11+ for the bridge (and for the
runner's `answer` command, whose shebang is `script_python`: the image's interpreter), and what the task runs. Pi
runs from the host with `mounts=(its package directory, the node binary)` in a glibc image (tested on Debian
bookworm); the SWE loader's default test command is the host's `sys.executable`, whose installation a set-up or
test command that names it gets bound (`agents.graders.runs_from`). Images are never pulled.
A cold run costs a container start: about 0.25 s for `exec("true")` here, against 0.04 s in a namespace sandbox.
`warm()` starts the next run's container ahead (`LocalSandbox.warm`): it waits, under the subreaper shim mounted at
/opt/interceptor/proctree.py and run by the image's python, for the launch on stdin; the agent's variables then come
with the launch rather than `-e`, over the image's own as with `-e`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Self

from agents.errors import AgentConfigError, AgentError
from agents.sandbox import netbridge, proctree
from agents.sandbox.base import LocalSandboxConfig
from agents.sandbox.bridged import BridgedSandbox
from agents.sandbox.cgroups import DEFAULT_LIMITS, ResourceLimits
from agents.sandbox.egress import EgressPolicy
from agents.sandbox.namespace import SandboxUnavailable
from agents.specs.spec import AgentLaunch

__all__ = ["ContainerLimits", "DockerSandbox", "docker_unavailable", "remove_stale_containers"]

LABEL = "interceptor.sandbox"
_BRIDGE_IN_CONTAINER = "/opt/interceptor/netbridge.py"  # netbridge.py, bound read-only
_PROCTREE_IN_CONTAINER = "/opt/interceptor/proctree.py"  # the warm spare's launcher, bound read-only
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # an image that sets none
# The docker client's own settings, taken from our environment; an agent variable of the same name is refused.
_CLIENT_ENV = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
_PROBE_S = 20.0  # `docker info` / `image inspect`; a daemon slower than that is as good as absent
_REMOVE_S = 30.0  # `docker rm -f` of one container (SIGKILL, then the layer's removal)


ContainerLimits = ResourceLimits  # the same limits as the namespace backend's, enforced by the daemon


def _limit_args(limits: ResourceLimits) -> list[str]:
    args = []
    if limits.cpus is not None:
        args += ["--cpus", f"{limits.cpus:g}"]
    if limits.memory_bytes is not None:
        args += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    if limits.pids is not None:
        args += ["--pids-limit", str(limits.pids)]
    return args


@functools.cache
def docker_unavailable(docker: str = "docker") -> str | None:
    """Why no container can be started here (no client, or no daemon answering it), or None. Probed once."""
    path = shutil.which(docker)
    if path is None:
        return f"{docker} is not installed (scripts/setup-docker.sh installs docker.io and starts a daemon)"
    try:
        done = subprocess.run([path, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=_PROBE_S, check=False, env=_client_env())  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{docker} info failed: {exc}"
    if done.returncode != 0:
        return f"no Docker daemon answers ({docker} info): {(done.stderr or done.stdout).strip()}"
    return None


def remove_stale_containers(docker: str = "docker") -> list[str]:
    """Remove every sandbox container (by label) still there, e.g. after a trainer was killed; returns their names.
    Only for a machine where no other trainer is running sandboxes at the same time."""
    path = shutil.which(docker) or docker
    listing = [path, "ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}"]
    listed = subprocess.run(listing, capture_output=True, text=True, timeout=_PROBE_S, check=True, env=_client_env())
    names = listed.stdout.split()
    if names:
        subprocess.run([path, "rm", "-f", *names], capture_output=True, timeout=_REMOVE_S, check=False,
                       env=_client_env())  # fmt: skip
    return names


class DockerSandbox(BridgedSandbox):
    binds_paths = True
    _inherited = ("HOME", "HOSTNAME")
    def __init__(
        self,
        config: LocalSandboxConfig | None = None,
        *,
        image: str,
        endpoint: tuple[str, int] | None = None,
        mounts: Sequence[Path] = (),
        python: str = "python3",
        limits: ContainerLimits | None = None,
        docker: str = "docker",
        network: str = "model",
        warm_paths: Sequence[Path] = (),
        egress: EgressPolicy | None = None,
        workdir: str | None = None,
    ) -> None:
        """`workdir`: where the box's workspace is inside (an image's WORKDIR, e.g. /app, which a task's own files
        and instruction name): seeded with what the image holds there, bound there, and where every run starts."""
        if not image:
            raise AgentConfigError("image is empty")
        if workdir is not None and (not workdir.startswith("/") or workdir.rstrip("/") in ("", "/proc", "/dev",
                                                                                               "/tmp")):
            raise AgentConfigError(f"workdir must be an absolute path of the box's own, not {workdir!r}")
        super().__init__(config, endpoint=endpoint, network=network, egress=egress)  # open: --network host
        self.workdir = workdir.rstrip("/") if workdir else None
        self.image = image
        self.mounts = tuple(Path(path).resolve() for path in mounts)
        for path in (*self.mounts, Path(netbridge.__file__)):
            _check_mountable(path)
        self.python = python
        # None: the same default limits as the namespace backend's (the daemon always can set them);
        # ContainerLimits(): none.
        self.container_limits = DEFAULT_LIMITS if limits is None else limits
        self.docker = docker
        self._image_env: dict[str, str] = {}
        # What a warm spare's container mounts besides `mounts` (e.g. the agent's and the graders' programs): a
        # run that needs a host path outside them starts cold.
        self.warm_paths = tuple(Path(path).resolve() for path in warm_paths)

    async def __aenter__(self) -> Self:
        reason = docker_unavailable(self.docker)
        if reason is not None:
            raise SandboxUnavailable(reason)
        self._image_env = await _image_env(self._client(), self.image)
        entered = await super().__aenter__()
        _check_mountable(self.root)
        self._open_bridges()
        if self.workdir is not None:
            try:
                await self._seed_workspace()
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return entered

    async def _seed_workspace(self) -> None:
        """The image's `workdir` copied into the workspace (a directory the image lacks leaves it empty)."""
        name = f"interceptor-seed-{secrets.token_hex(8)}"
        try:
            await self._docker("create", "--name", name, "--label", f"{LABEL}=1", self.image, "true")
            await self._docker("cp", f"{name}:{self.workdir}/.", str(self.workspace))
        except AgentError as exc:
            if "Could not find the file" not in str(exc):
                raise SandboxUnavailable(f"the image's {self.workdir} could not be copied out: {exc}") from exc
        finally:
            await asyncio.shield(self._remove(name))

    async def warm(self) -> None:
        """A box with a `workdir` starts every run cold (a spare's shim would start in the host path)."""
        if self.workdir is None:
            await super().warm()

    def _fits(self, launch: AgentLaunch, made_for: AgentLaunch) -> bool:
        return self.workdir is None and super()._fits(launch, made_for)

    def _box_cwd(self, cwd: Path) -> str:
        """Where a run starts inside: the workspace is at `workdir` when there is one."""
        if self.workdir is not None and cwd.is_relative_to(self.workspace):
            return str(Path(self.workdir) / cwd.relative_to(self.workspace))
        return str(cwd)

    @property
    def script_python(self) -> str:
        """The image's Python (the one the bridge runs on), not this host's."""
        return self.python if self.python.startswith("/") else f"/usr/bin/env {self.python}"

    def _host_view(self, launch: AgentLaunch) -> list[Path]:
        return self._mounts_for(launch)

    def _program(self, launch: AgentLaunch, env: dict[str, str]) -> list[str] | None:
        if clash := set(launch.env) & set(_CLIENT_ENV):
            raise AgentConfigError(f"the docker client reads {sorted(clash)} itself: rename the agent's variables")
        return list(launch.argv)  # looked up in the image, not on the host

    def _shim(self, program: list[str]) -> list[str]:
        return program  # tini (--init) is the container's reaper

    def _launcher(self) -> list[str]:
        return [self.python, "-I", _PROCTREE_IN_CONTAINER, "--grace", str(self.config.kill_grace_s), "--launch-stdin"]

    def _agent_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        env = super()._agent_env(launch, env)
        if "PATH" not in launch.env:
            env = {**env, "PATH": f"{self.bin_dir}:{self._image_env.get('PATH') or _DEFAULT_PATH}"}
        return env

    def _launch_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        """A warm launch's whole environment, as `docker run -e` makes it: the image's, then the agent's (HOME and
        HOSTNAME, which the runtime sets, are kept from the container's)."""
        return {**self._image_env, **env}

    @contextlib.asynccontextmanager
    async def _hold(self, launch: AgentLaunch, hits: dict[str, int]) -> AsyncIterator[_Container]:
        container = await self._container(launch)
        refused = self._refused()
        try:
            async with self._attached(container):
                yield container
        finally:
            if refused_now := self._refused() - refused:
                hits["connections"] = refused_now
            # Shielded: a cancelled run still removes its container (the removal goes on if we are cancelled again).
            await asyncio.shield(self._remove(container.name))

    async def _container(self, launch: AgentLaunch) -> _Container:
        """The container one run starts: its name, image and model endpoint bridge."""
        port, socket = await self._bridge(launch)
        proxy_port, proxy_socket = await self._egress_bridge(launch)
        return _Container(name=f"interceptor-{secrets.token_hex(8)}", image=self.image, port=port, socket=socket,
                          proxy_port=proxy_port, proxy_socket=proxy_socket)  # fmt: skip

    def _attached(self, container: _Container) -> contextlib.AbstractAsyncContextManager[object]:
        """What runs beside the container while it runs (nothing here: its bridge's socket is bound in)."""
        return contextlib.nullcontext()

    def _mount_args(self, launch: AgentLaunch, *, waiting: bool, bridged: bool) -> list[str]:
        """The rollout's directory bound writable, what the launch runs from read-only, the shim and bridge."""
        args = ["--mount", _bind(self.root, readonly=False)]
        if self.workdir is not None:
            args += ["--mount", f"type=bind,src={self.workspace},dst={self.workdir}"]
        args += [arg for path in self._mounts_for(launch) for arg in ("--mount", _bind(path, readonly=True))]
        if waiting:
            shim = Path(proctree.__file__).resolve()
            args += ["--mount", f"type=bind,src={shim},dst={_PROCTREE_IN_CONTAINER},readonly"]
        if bridged:
            bridge = Path(netbridge.__file__).resolve()
            args += ["--mount", f"type=bind,src={bridge},dst={_BRIDGE_IN_CONTAINER},readonly"]
        for bind in launch.binds:
            _check_mountable(bind.source)
            _check_mountable(Path(bind.target))
            args += ["--mount", f"type=bind,src={bind.source},dst={bind.target}" + ("" if bind.writable else ",readonly")]
        return args

    def _wrap(
        self, launch: AgentLaunch, argv: list[str], env: dict[str, str], held: object
    ) -> tuple[list[str], dict[str, str]]:
        container = held
        assert isinstance(container, _Container)
        waiting = argv == self._launcher()  # a warm spare: its environment and stdin come through the launch
        command = [
            self._client(), "run", "--rm",
            "--name", container.name,
            "--label", f"{LABEL}=1",
            "--init",  # tini as PID 1: orphans reaped; the container (all of it) ends when the agent does
            "--network", "host" if self.network == "open" else "none",
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--user", f"{os.getuid()}:{os.getgid()}",  # files in the workspace stay the host user's
            "--hostname", "sandbox",
            "--workdir", self._box_cwd(launch.cwd),
            *self._mount_args(launch, waiting=waiting, bridged=(container.port or container.proxy_port) is not None),
            *_limit_args(self.container_limits),
            *(arg for key in env for arg in ("-e", key)),  # the value from the client's environment, not argv
        ]  # fmt: skip
        if waiting or launch.stdin is not None:
            command.append("--interactive")
        command += ["--", container.image]
        if container.port is not None:
            command += [self.python, "-I", _BRIDGE_IN_CONTAINER, "--port", str(container.port)]
            command += ["--unix", str(container.socket), "--"]
        if container.proxy_port is not None:  # the egress proxy: a second bridge, on its own port
            command += [self.python, "-I", _BRIDGE_IN_CONTAINER, "--port", str(container.proxy_port)]
            command += ["--unix", str(container.proxy_socket), "--"]
        command += argv
        return command, {**env, **_client_env()}

    def _mounts_for(self, launch: AgentLaunch) -> list[Path]:
        """The sandbox's own read-only mounts and what the program runs from on the host (`launch.host_paths`),
        minus anything inside the rollout's directory (mounted writable already) or under another mount."""
        paths = sorted({*self.mounts, *(Path(p).resolve() for p in launch.host_paths)}, key=lambda p: len(p.parts))
        kept: list[Path] = []
        for path in paths:
            if path.exists() and not path.is_relative_to(self.root) and not any(path.is_relative_to(k) for k in kept):
                _check_mountable(path)
                kept.append(path)
        return kept

    async def _remove(self, name: str) -> None:
        """`docker rm -f`: SIGKILL to everything in the container, then its removal. Gone already is fine."""
        process = await asyncio.create_subprocess_exec(
            self._client(), "rm", "-f", name, env=_client_env(),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await asyncio.wait_for(process.wait(), _REMOVE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    def _client(self) -> str:
        return shutil.which(self.docker) or self.docker

    async def _docker(self, *args: str) -> str:
        """`docker ARGS...`: its stdout, or AgentError with its stderr."""
        process = await asyncio.create_subprocess_exec(
            self._client(), *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_client_env())
        out, err = await process.communicate()
        if process.returncode != 0:
            raise AgentError(f"docker {args[0]} {args[1] if len(args) > 1 else ''} failed: {err.decode().strip()}")
        return out.decode().strip()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Container:
    name: str
    image: str  # the sandbox's image, or one made from it (`agents.sandbox.docker.remote`)
    port: int | None  # the model endpoint's port, forwarded inside; None: no network at all
    socket: str | None  # the Unix socket its bridge forwards to (the host half's, bound in)
    carried_to: str | None = None  # the host half's socket, where `socket` is the box's own (carried by stdiomux)
    proxy_port: int | None = None  # the egress proxy's port inside; None: no egress list
    proxy_socket: str | None = None  # its Unix socket, as `socket`
    proxy_carried_to: str | None = None  # its host half's, as `carried_to`


def _client_env() -> dict[str, str]:
    # The one place this module reads the host environment: how the docker client finds its daemon. (The client is
    # started by its absolute path, and its PATH is the agent's.)
    return {key: os.environ[key] for key in _CLIENT_ENV if key in os.environ}


async def _image_env(docker: str, image: str) -> dict[str, str]:
    """The image's own environment (e.g. a SWE image's conda bin first on PATH); SandboxUnavailable when the image
    is not here."""
    process = await asyncio.create_subprocess_exec(
        docker, "image", "inspect", "--format", "{{json .Config.Env}}", image, env=_client_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), _PROBE_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SandboxUnavailable(f"docker image inspect {image} did not answer in {_PROBE_S:g} s") from None
    if process.returncode != 0:
        raise SandboxUnavailable(f"image {image} is not available (images are not pulled): {err.decode().strip()}")
    pairs = (item.partition("=") for item in json.loads(out) or ())
    return {key: value for key, _, value in pairs if key}


def _bind(path: Path, *, readonly: bool) -> str:
    return f"type=bind,src={path},dst={path}" + (",readonly" if readonly else "")


def _check_mountable(path: Path) -> None:
    if "," in str(path) or "=" in str(path):
        raise AgentConfigError(f"cannot bind-mount {path}: ',' and '=' are separators of docker's --mount")
