"""A Docker network of one Harbor trial's own: its box reaches this host's box port there, and nothing else.

    async with TrialNetwork("interceptor-trial-<rollout id>") as network:
        url = await server.box_port.expose(network.gateway)     # the rollout routes alone, on the gateway address
        override = network.compose_override(work_dir)          # Harbor's `extra_docker_compose`: main joins it

The network is `--internal` (Docker routes nothing from it to other networks or out of the host) and holds one trial's
containers only, so a box cannot reach another rollout's box. On the host side its gateway address is this host's,
where the server listens for that trial with the box port: the rollout routes, each behind its secret, never the admin
API. (Any other service the host runs on all addresses, 0.0.0.0, is on that address too: bind host services to
loopback.) On the way out, whatever is still attached to the network (a trial Harbor could not take down) is
removed with it, so a trial leaves no container or network behind.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from agents.errors import AgentError

__all__ = ["LABEL", "TrialNetwork", "has_default_bridge"]

LABEL = "interceptor.harbor-trial"  # on every trial network: what a clean-up (or a test) finds them by
_SERVICE_NETWORK = "interceptor"  # the name the compose override gives it


class TrialNetwork:
    def __init__(self, name: str, *, internal: bool = True, docker: str = "docker") -> None:
        self.name = name
        self._internal = internal  # False for a task whose network is public: Docker routes it out as any other
        self._docker = docker
        self.gateway = ""

    async def __aenter__(self) -> TrialNetwork:
        await self._run("network", "create", *(["--internal"] if self._internal else []), "--label", f"{LABEL}=1",
                        self.name)  # fmt: skip
        try:
            config = json.loads(await self._run("network", "inspect", self.name, "--format", "{{json .IPAM.Config}}"))
            gateways = [entry.get("Gateway") for entry in config or () if entry.get("Gateway")]
            if not gateways:
                raise AgentError(f"docker network {self.name} has no gateway address for the box port")
            self.gateway = gateways[0]
        except BaseException:
            await self._remove()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self._remove())

    def compose_override(self, directory: Path, *, build_offline: bool = False) -> Path:
        """A compose file putting Harbor's main service on this network alone (JSON is YAML). `build_offline`: its
        image's RUN steps get no network (a daemon with no default bridge cannot give them one)."""
        # its PID 1 is Harbor's `sleep infinity`, which ignores SIGTERM: without a short grace, each take-down
        # waits Docker's default 10 s for a box that is being removed anyway
        main: dict = {"networks": [_SERVICE_NETWORK], "stop_grace_period": "1s"}
        if build_offline:
            main["build"] = {"network": "none"}
        path = directory / "interceptor-network.compose.json"
        path.write_text(json.dumps({
            "services": {"main": main},
            "networks": {_SERVICE_NETWORK: {"external": True, "name": self.name}},
        }))  # fmt: skip
        return path

    async def _remove(self) -> None:
        left = (await self._run("ps", "-aq", "--filter", f"network={self.name}", check=False)).split()
        if left:
            await self._run("rm", "-f", *left, check=False)
        await self._run("network", "rm", self.name, check=False)

    async def _run(self, *args: str, check: bool = True) -> str:
        process = await asyncio.create_subprocess_exec(self._docker, *args, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
        out, err = await process.communicate()
        if check and process.returncode != 0:
            raise AgentError(f"docker {' '.join(args[:2])} failed: {err.decode(errors='replace').strip()[-500:]}")
        return out.decode(errors="replace").strip()


async def has_default_bridge(docker: str = "docker") -> bool:
    """Whether the daemon has its default bridge (`dockerd --bridge=none` has none: a build's RUN steps fail on it
    with "network bridge not found" unless they are given no network)."""
    process = await asyncio.create_subprocess_exec(docker, "network", "inspect", "bridge", stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)  # fmt: skip
    return await process.wait() == 0
