"""A Docker sandbox whose box shares no file system with this host: what a daemon on another machine needs.

    async with RemoteDockerSandbox(image="interceptor/debian-python:bookworm", endpoint=("127.0.0.1", port),
                                   mounts=(pi_install, node)) as box:
        await box.put_tree(task_dir)                # files go in through the daemon
        result = await box.run(launch, limits=...)  # the same runs as DockerSandbox's
        await box.pull_workspace()                  # and come back out through it, for the host's graders

`DockerSandbox` binds the rollout's directory and the agent's programs from this host. This backend binds nothing:
- the rollout's directory is a named volume of the daemon (`interceptor-<hex>`), mounted at the same path in every
  run's container, so the launch's paths stay valid; files go in and out with `docker cp` through a container that
  is created for the volume and never started. The host keeps a copy at the same path (`box.workspace` and the rest),
  written with each `put_files` and `put_tree` and brought up to date by `pull_workspace`; what the box writes is
  seen on the host only then;
- what the launch runs from (`mounts`, `launch.host_paths`: an agent's install, its Node) and this package's in-box
  scripts are copied once into an image made from the task's (`interceptor/box:<key>`, `agents.sandbox.docker.files`),
  owned by root, at their own paths; a run starts a container of that image;
- the model endpoint: the box's bridge (`agents.sandbox.netbridge`) forwards the agent's connections to a Unix socket
  inside the volume, served by `agents.sandbox.stdiomux` started in the running container with `docker exec -i`; its
  streams come out on that exec's pipes and go to the host half of the bridge, whose guard is unchanged.

Everything else is `DockerSandbox`'s: `--network none`, the user, dropped capabilities, limits, `--init`, removal.
Not here: a warm spare (`warm()` does nothing: every run starts cold), and the disk limit, which is watched on the
host's copy (the volume is on the daemon's disk; the daemon's memory and pids limits apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Self

from agents.errors import AgentError
from agents.sandbox import netbridge, proctree, stdiomux
from agents.sandbox.base import LocalSandboxConfig
from agents.sandbox.docker import files as docker_files
from agents.sandbox.egress import EgressPolicy
from agents.sandbox.docker.container import (
    _BRIDGE_IN_CONTAINER,
    _PROCTREE_IN_CONTAINER,
    LABEL,
    ContainerLimits,
    DockerSandbox,
    _client_env,
    _Container,
)
from agents.specs.spec import AgentLaunch, BoxFile

__all__ = ["RemoteDockerSandbox"]

_MUX_IN_CONTAINER = "/opt/interceptor/stdiomux.py"
_SCRIPTS = ((_BRIDGE_IN_CONTAINER, netbridge), (_PROCTREE_IN_CONTAINER, proctree), (_MUX_IN_CONTAINER, stdiomux))
_ATTACH_EVERY_S = 0.05  # between tries of `docker exec` while the run's container is starting
_STATE = ".interceptor"  # in the rollout's directory: the box's bridge socket


class RemoteDockerSandbox(DockerSandbox):
    binds_paths = False  # nothing of this host is bound into its boxes
    def __init__(
        self,
        config: LocalSandboxConfig | None = None,
        *,
        image: str,
        endpoint: tuple[str, int] | None = None,
        mounts: Sequence[Path] = (),  # copied into the run's image, not bound
        python: str = "python3",
        limits: ContainerLimits | None = None,
        docker: str = "docker",
        network: str = "model",
        egress: EgressPolicy | None = None,
    ) -> None:
        super().__init__(config, image=image, endpoint=endpoint, mounts=mounts, python=python, limits=limits,
                         docker=docker, network=network, egress=egress)  # fmt: skip
        self._volume: str | None = None
        self._image_id = ""
        self._layers: dict[str, str] = {}  # key -> tag, made by this sandbox

    async def __aenter__(self) -> Self:
        entered = await super().__aenter__()
        try:
            self._image_id = await self._docker("image", "inspect", "--format", "{{.Id}}", self.image)
            (self.root / _STATE).mkdir(mode=0o700)
            volume = f"interceptor-{secrets.token_hex(8)}"
            await self._docker("volume", "create", "--label", f"{LABEL}=1", volume)
            self._volume = volume
            await self._docker("create", "--name", self._files, "--label", f"{LABEL}=1",
                               "--mount", f"type=volume,src={volume},dst={self.root}", self.image, "true")
            dirs = [self.workspace, self.home, self.bin_dir, self.tmp, self.root / _STATE]
            await self._copy_in(dirs)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return entered

    async def __aexit__(self, *exc_info: object) -> None:
        volume, self._volume = self._volume, None
        try:
            await super().__aexit__(*exc_info)
        finally:
            if volume is not None:
                await asyncio.shield(self._forget(volume))

    @property
    def _files(self) -> str:
        """The container `docker cp` goes through: created with the volume, never started."""
        assert self._volume is not None, "the sandbox is not entered"
        return f"{self._volume}-files"

    async def warm(self) -> None:
        """Nothing is started ahead here: every run starts its container cold."""

    async def put_files(self, files: tuple[BoxFile, ...]) -> None:
        """Written on the host's copy, then copied into the box with their parents' modes."""
        if files:
            await super().put_files(files)
            await self._copy_in([box_file.path for box_file in files])

    async def put_tree(self, source: Path) -> None:
        await super().put_tree(source)
        await self._copy_in([self.workspace])

    async def pull_workspace(self) -> None:
        """The box's workspace replaces the host's copy (links out of it and special files left out)."""
        await asyncio.to_thread(docker_files.copy_out, self._client(), _client_env(), self._files, self.workspace,
                                self.workspace)  # fmt: skip

    async def push_workspace(self) -> None:
        """The host's copy replaces the box's workspace (after a host-side grader changed it)."""
        cleared = await self.exec("chmod -R u+w . 2>/dev/null; find . -mindepth 1 -delete", timeout_s=120)
        if not cleared.ok:
            raise docker_files.DaemonFileError(f"the box's workspace could not be cleared: {cleared.output[-500:]}")
        await self._copy_in([self.workspace])

    # ------------------------------------------------------------------------------ DockerSandbox's hooks

    async def _container(self, launch: AgentLaunch) -> _Container:
        image = await self._layered(self._mounts_for(launch))
        port, host_socket = await self._bridge(launch)
        proxy_port, proxy_socket = await self._egress_bridge(launch)
        inside = str(self.root / _STATE / "model.sock") if port is not None else None
        proxy_inside = str(self.root / _STATE / "egress.sock") if proxy_port is not None else None
        return _Container(name=f"interceptor-{secrets.token_hex(8)}", image=image, port=port, socket=inside,
                          carried_to=host_socket, proxy_port=proxy_port, proxy_socket=proxy_inside,
                          proxy_carried_to=proxy_socket)  # fmt: skip

    @contextlib.asynccontextmanager
    async def _attached(self, container: _Container) -> AsyncIterator[None]:
        """The box's sockets (its model endpoint's, its egress proxy's) each carried to their host half."""
        carried = [(inside, host) for inside, host in ((container.socket, container.carried_to),
                                                        (container.proxy_socket, container.proxy_carried_to))
                   if inside is not None and host is not None]  # fmt: skip
        carrying = [asyncio.create_task(self._carry(container.name, inside, host)) for inside, host in carried]
        try:
            yield
        finally:
            for task in carrying:
                task.cancel()
            await asyncio.gather(*carrying, return_exceptions=True)

    def _mount_args(self, launch: AgentLaunch, *, waiting: bool, bridged: bool) -> list[str]:
        assert self._volume is not None, "the sandbox is not entered"
        return ["--mount", f"type=volume,src={self._volume},dst={self.root}"]

    # ------------------------------------------------------------------------------ the daemon's side

    async def _carry(self, name: str, inside: str, host_socket: str) -> None:
        """A box's socket (`inside`), served from inside the container and carried to its host half, from the moment
        the container runs until it ends. Before it runs `docker exec` fails at once, and is tried again."""
        command = [self._client(), "exec", "--interactive", "--user", f"{os.getuid()}:{os.getgid()}", name,
                   self.python, "-I", _MUX_IN_CONTAINER, "--unix", inside]
        while True:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=_client_env())  # fmt: skip
            assert process.stdout is not None and process.stdin is not None
            hello = asyncio.Event()
            try:
                await stdiomux.carry(process.stdout, process.stdin, hello=hello,
                                     connect=lambda: asyncio.open_unix_connection(host_socket))  # fmt: skip
            finally:
                await _ended(process)
            if hello.is_set():
                return  # it was up, and the container ended
            await asyncio.sleep(_ATTACH_EVERY_S)

    async def _layered(self, paths: list[Path]) -> str:
        scripts = [(inside, Path(module.__file__).read_bytes()) for inside, module in _SCRIPTS]
        key = docker_files.layer_key(self._image_id, paths, scripts)
        if key not in self._layers:
            self._layers[key] = await asyncio.to_thread(
                docker_files.layered_image, self._client(), _client_env(), self.image, key, paths, scripts,
                label=LABEL)  # fmt: skip
        return self._layers[key]

    async def _copy_in(self, paths: list[Path]) -> None:
        await asyncio.to_thread(docker_files.copy_in, self._client(), _client_env(), self._files, self.root, paths)

    async def _forget(self, volume: str) -> None:
        """The files container, then the volume (and with it everything the box wrote)."""
        for args in (("rm", "-f", f"{volume}-files"), ("volume", "rm", "-f", volume)):
            with contextlib.suppress(AgentError):
                await self._docker(*args)


async def _ended(process: asyncio.subprocess.Process) -> None:
    """A `docker exec` client ended: given a moment to exit on its own (its pipe has ended, or it is told so by the
    end of its stdin), then killed. Not killed at once: a kill reaps an exited child before asyncio's watcher does."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), 2.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
