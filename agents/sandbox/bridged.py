"""What the isolating backends share: a sandbox whose only way out is its model endpoint, over `netbridge`.

`BridgedSandbox` keeps the sandbox's host-side bridges (one per endpoint, open until the sandbox closes), decides
which endpoint a launch is forwarded to (`endpoint=`, else the launch's OPENAI_BASE_URL; none with an open
network), and rewrites that base URL to the loopback address the bridge listens on inside. A box whose task lists
egress destinations also gets its proxy (`agents.sandbox.egress`), carried the same way on a port of its own.
"""

from __future__ import annotations

from pathlib import Path

from agents.errors import AgentConfigError
from agents.sandbox import netbridge
from agents.sandbox.egress import EgressPolicy, EgressProxy, Refusal, proxy_env, proxy_port
from agents.sandbox.base import LocalSandbox, LocalSandboxConfig
from agents.specs.spec import AgentLaunch

__all__ = ["BridgedSandbox"]


class BridgedSandbox(LocalSandbox):
    def __init__(
        self, config: LocalSandboxConfig | None, *, endpoint: tuple[str, int] | None, network: str,
        egress: EgressPolicy | None = None,
    ) -> None:
        if network not in ("model", "open"):
            raise AgentConfigError(f"network must be 'model' or 'open', not {network!r}")
        if egress and network == "open":
            raise AgentConfigError("an egress list narrows the model-only network; an open one reaches everything")
        super().__init__(config)
        self.endpoint = endpoint
        self.network = network  # open: the host's network, for a task that says so
        self.egress = egress or None  # the destinations its proxy lets through; None: no proxy
        self._bridges: netbridge.BridgeSet | None = None
        self._proxy: EgressProxy | None = None
        self.warm_paths: tuple[Path, ...] = ()  # host paths a warm spare is made to see besides the backend's own

    def _open_bridges(self) -> None:
        """Called once the sandbox's directory exists (the sockets live in it)."""
        self._bridges = netbridge.BridgeSet(self.root)

    async def __aexit__(self, *exc_info: object) -> None:
        await self._put_away_spare()  # before the bridges it uses close
        bridges, self._bridges = self._bridges, None
        if bridges is not None:
            await bridges.aclose()
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            await proxy.__aexit__(None, None, None)
        await super().__aexit__(*exc_info)

    async def _egress_bridge(self, launch: AgentLaunch) -> tuple[int | None, str | None]:
        """(port inside, host socket) of the box's egress proxy; (None, None) without an egress list."""
        if self.egress is None:
            return None, None
        if self._proxy is None:
            assert self._bridges is not None, "the sandbox is not entered"
            proxy = EgressProxy(self.root / "egress.sock", self.egress)
            await proxy.__aenter__()
            self._proxy = proxy
        endpoint = self._endpoint(launch)
        return proxy_port(endpoint[1] if endpoint else None), str(self._proxy.path)

    def _egress_count(self) -> int:
        return self._proxy.refused if self._proxy is not None else 0

    def _egress_refusals(self) -> list[Refusal]:
        return self._proxy.refusals if self._proxy is not None else []

    def _refused(self) -> int:
        """Connections this sandbox's bridges have turned away so far (past their cap)."""
        return self._bridges.refused() if self._bridges is not None else 0

    def _endpoint(self, launch: AgentLaunch) -> tuple[str, int] | None:
        """The endpoint forwarded into the sandbox for this launch; None: no bridge (no network, or an open one)."""
        if self.network == "open":
            return None
        return self.endpoint or netbridge.endpoint_of(launch.env.get("OPENAI_BASE_URL"))

    async def _bridge(self, launch: AgentLaunch) -> tuple[int | None, str | None]:
        """(port inside, host socket) of this launch's bridge; (None, None) without one."""
        endpoint = self._endpoint(launch)
        if endpoint is None:
            return None, None
        assert self._bridges is not None, "the sandbox is not entered"
        return endpoint[1], str(await self._bridges.socket_for(netbridge.host_target(*endpoint)))

    def _template(self) -> AgentLaunch:
        """A warm spare is made for the sandbox's `warm_paths` (what agents run from), besides its own view."""
        return AgentLaunch(argv=("(warm)",), env={}, cwd=self.workspace, host_paths=self.warm_paths)

    def _fits(self, launch: AgentLaunch, made_for: AgentLaunch) -> bool:
        """The same endpoint, and every host path the launch runs from in the spare's view of the host already
        (a mount namespace or a container cannot take more once started): otherwise the run starts cold."""
        if self._endpoint(launch) != self._endpoint(made_for) or launch.binds != made_for.binds:
            return False
        seen = self._host_view(made_for)
        return all(any(p.is_relative_to(v) for v in seen) or p.is_relative_to(self.root)
                   for p in (Path(q).resolve() for q in launch.host_paths) if p.exists())

    def _host_view(self, launch: AgentLaunch) -> list[Path]:
        """The host paths a process started for `launch` sees, read-only (the backend's binds or mounts)."""
        raise NotImplementedError

    def _agent_env(self, launch: AgentLaunch, env: dict[str, str]) -> dict[str, str]:
        endpoint = self._endpoint(launch)
        if endpoint is not None and "OPENAI_BASE_URL" in env:
            env = {**env, "OPENAI_BASE_URL": netbridge.on_loopback(env["OPENAI_BASE_URL"])}
        if self.egress is not None:
            env = {**env, **proxy_env(proxy_port(endpoint[1] if endpoint else None))}
        return env
