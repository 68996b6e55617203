"""The sandbox backends in one table, and the one choice of the backend a task runs in.

`run`, `train`, `evaluate` and `replay` (through `agents.runner.Runner`) and TRL environments
(`trainer.rl.environment_host`) all choose here, with `--sandbox`'s words:

    auto       a task with an `image` runs in Docker (bind-mounting its rollout's directory; with a daemon on
               another machine, `DOCKER_HOST=tcp://...` or `ssh://...`, in `docker-remote`, which binds nothing);
               any other in bubblewrap namespaces where this machine allows them, else with no isolation (a warning,
               and refused when resource limits are asked for)
    namespace  bubblewrap namespaces for every task (a task's image is not used); refused where this machine
               lacks them
    local      no isolation, for trusted programs, every task (nor here); refused with resource limits

A new backend is its module in this package, one `Backend` in `BACKENDS` (and in `CHOICES` if a user may pick it
for every task) and its tests: `tests/agents/test_backends.py` runs a command in every registered backend this
machine has.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from agents.errors import AgentConfigError
from agents.sandbox.base import LocalSandbox, Sandbox
from agents.sandbox.cgroups import ResourceLimits
from agents.sandbox.egress import EgressPolicy
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable

__all__ = ["BACKENDS", "CHOICES", "Backend", "BoxChooser", "Placement"]

log = logging.getLogger(__name__)


def _no_paths() -> tuple[Path, ...]:
    return ()


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What a box needs from whoever opens it, whichever backend makes it."""

    endpoint: tuple[str, int] | None = None  # (host, port) of the model endpoint its agent reaches; None: no model
    hidden: tuple[Path, ...] = ()  # host paths never shown inside (the record files: other rollouts' trajectories)
    resources: ResourceLimits | None = None  # each run's limits; None: the backend's defaults
    warm_paths: Callable[[], tuple[Path, ...]] = _no_paths  # read as each box is made: what its warm spare also sees


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    isolating: bool  # its own namespaces or container, an allow-list of the host, resource limits
    unavailable: Callable[[], str | None]  # why it cannot run on this machine, or None
    # (placement, image, network, egress, workdir) -> a new box; egress: destinations besides the model
    # (`agents.sandbox.egress`); workdir: where the workspace is in the image (`DockerSandbox`)
    make: Callable[[Placement, str | None, str, tuple[str, ...], str | None], Sandbox]


def _local(
    placement: Placement, image: str | None, network: str, egress: tuple[str, ...], workdir: str | None
) -> Sandbox:
    if egress:
        raise AgentConfigError("an egress list needs an isolating sandbox: with no isolation the box reaches anything")
    return LocalSandbox()  # shares everything with the host, network included


def _namespace(
    placement: Placement, image: str | None, network: str, egress: tuple[str, ...], workdir: str | None
) -> Sandbox:
    return NamespaceSandbox(endpoint=placement.endpoint, hidden=placement.hidden, resources=placement.resources,
                            network=network, warm_paths=placement.warm_paths(), egress=EgressPolicy.parse(egress))


def _docker(
    placement: Placement, image: str | None, network: str, egress: tuple[str, ...], workdir: str | None
) -> Sandbox:
    from agents.sandbox.docker import DockerSandbox  # noqa: PLC0415  (only tasks with an image need Docker)

    if image is None:
        raise AgentConfigError("the docker backend runs tasks that name an image")
    return DockerSandbox(image=image, network=network, endpoint=placement.endpoint, limits=placement.resources,
                         warm_paths=placement.warm_paths(), egress=EgressPolicy.parse(egress), workdir=workdir)


def _docker_remote(
    placement: Placement, image: str | None, network: str, egress: tuple[str, ...], workdir: str | None
) -> Sandbox:
    from agents.sandbox.docker.remote import RemoteDockerSandbox  # noqa: PLC0415

    if image is None:
        raise AgentConfigError("the docker-remote backend runs tasks that name an image")
    return RemoteDockerSandbox(image=image, network=network, endpoint=placement.endpoint, limits=placement.resources,
                               egress=EgressPolicy.parse(egress))


def _daemon_elsewhere() -> bool:
    """The docker client talks to a daemon that may be on another machine (it cannot see this host's paths)."""
    host = os.environ.get("DOCKER_HOST", "")
    return bool(host) and not host.startswith("unix://")


def _docker_unavailable() -> str | None:
    from agents.sandbox.docker import docker_unavailable  # noqa: PLC0415

    return docker_unavailable()


LOCAL = Backend(name="local", isolating=False, unavailable=lambda: None, make=_local)
NAMESPACE = Backend(name="namespace", isolating=True, unavailable=namespaces_unavailable, make=_namespace)
DOCKER = Backend(name="docker", isolating=True, unavailable=_docker_unavailable, make=_docker)
DOCKER_REMOTE = Backend(name="docker-remote", isolating=True, unavailable=_docker_unavailable, make=_docker_remote)
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (LOCAL, NAMESPACE, DOCKER, DOCKER_REMOTE)}
CHOICES = ("auto", "namespace", "local")  # `--sandbox`; Docker is chosen by a task's `image`


class BoxChooser:
    """The backend of each task, for one runner: `chooser(image, network, egress)` gives the pool's key for that kind
    of box and how to make one. Made once, so a refused choice is refused before any rollout starts."""

    def __init__(self, choice: str, placement: Placement) -> None:
        if choice not in CHOICES:
            raise AgentConfigError(f"sandbox must be one of {', '.join(CHOICES)}, not {choice!r}")
        limited = placement.resources is not None and placement.resources.any
        if choice == "auto":
            reason = NAMESPACE.unavailable()
            default = NAMESPACE if reason is None else LOCAL
            if reason is not None:
                if limited:
                    raise AgentConfigError(
                        f"resource limits need the namespace sandbox, which this machine lacks: {reason}")
                log.warning("rollouts run in LocalSandbox, as this user with no isolation, because %s", reason)
        else:
            default = BACKENDS[choice]
            if reason := default.unavailable():
                raise AgentConfigError(f"sandbox {choice}: {reason}")
            if limited and not default.isolating:
                raise AgentConfigError(f"resource limits need an isolating sandbox, not {choice}")
        self.choice = choice
        self.placement = placement
        self.default = default  # the backend of every task, but a task's with an image under auto

    def __call__(
        self, image: str | None = None, network: str = "model", egress: tuple[str, ...] = (), workdir: str | None = None
    ) -> tuple[Hashable, Callable[[], Sandbox]]:
        if image is not None and self.choice == "auto":
            backend = DOCKER_REMOTE if _daemon_elsewhere() else DOCKER
        else:
            backend, image = self.default, None
        if egress and not backend.isolating:
            raise AgentConfigError(f"a task with an egress list needs an isolating sandbox, not {backend.name}")
        if workdir is not None and backend is not DOCKER:
            raise AgentConfigError(f"a task with a workdir runs in its image with a local Docker daemon, not in "
                                   f"{backend.name}: its files are at {workdir} there")
        key = (backend.name, image, network, *((egress,) if egress else ()), *((workdir,) if workdir else ()))
        return key, functools.partial(backend.make, self.placement, image, network, tuple(egress), workdir)
