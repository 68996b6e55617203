"""The Docker backends: a container of the task's image per run, reaching nothing but its model endpoint.

- `container`: `DockerSandbox`, which binds the rollout's directory and the agent's programs from this host;
- `remote`: `RemoteDockerSandbox`, which binds nothing (a daemon on another machine): a volume, copies through the
  daemon (`files`) and the endpoint over a `docker exec` pipe (`agents.sandbox.stdiomux`).
"""

from agents.sandbox.docker.container import (
    LABEL,
    ContainerLimits,
    DockerSandbox,
    docker_unavailable,
    remove_stale_containers,
)

__all__ = ["LABEL", "ContainerLimits", "DockerSandbox", "docker_unavailable", "remove_stale_containers"]
