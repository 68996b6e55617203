"""Harbor's Docker environment on the network Interceptor gives each trial. Loaded into Harbor's own process by
import path (`environment.import_path = "interceptor_docker:InterceptorDockerEnvironment"`, this folder on its
PYTHONPATH): it is a plug-in of Harbor's, run by Harbor's Python (>= 3.12); Interceptor never imports it.

Harbor's Docker environment enforces "no-network" for a trial whose agent needs a model endpoint with an egress
sidecar image pulled from Docker Hub, which a machine without registry access cannot have. Interceptor's trial
network does the same job (`agents/harbor/network.py`): the main service joins an `--internal` network of the trial's
own, whose only other address is this host's gateway, where the server's box port serves the rollout routes alone.
So this environment is Harbor's Docker environment with:
- no egress sidecar: the trial network is the policy;
- "no-network", and an allow-list naming only the model endpoint's host (what Harbor asks for to let the agent reach
  its model), accepted; an allow-list naming any other host, or a public phase, refused before anything starts
  (Interceptor cannot honour them on an internal network).
"""

from __future__ import annotations

import os
from typing import Any

from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.docker.docker import DockerEnvironment
from harbor.models.task.config import NetworkMode, NetworkPolicy

MODEL_HOST = "INTERCEPTOR_MODEL_HOST"  # the box port's address on the trial network: the one host a box may reach


class InterceptorDockerEnvironment(DockerEnvironment):
    def __init__(self, *args: Any, network_policy: NetworkPolicy | None = None,
                 phase_network_policies: Any = None, **kwargs: Any) -> None:  # fmt: skip
        for policy in (network_policy, *(phase_network_policies or ())):
            if policy is not None:
                _refuse_unless_enforced(policy)
        super().__init__(*args, network_policy=network_policy, phase_network_policies=phase_network_policies,
                         **kwargs)  # fmt: skip

    @staticmethod
    def _requires_egress_control(**_: Any) -> bool:
        return False

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return super().capabilities.model_copy(update={
            "disable_internet": True, "network_allowlist": True, "network_allowlist_hostnames": True,
            "network_allowlist_ipv4_addresses": True, "network_allowlist_ipv6_addresses": True,
        })  # fmt: skip

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        _refuse_unless_enforced(network_policy)  # the trial network already is this policy: nothing to switch


def _refuse_unless_enforced(policy: NetworkPolicy) -> None:
    model_host = os.environ[MODEL_HOST]
    if policy.network_mode == NetworkMode.PUBLIC:
        raise ValueError("Interceptor's trial network is internal: a public network phase is not honoured here")
    others = sorted(set(policy.allowed_hosts) - {model_host})
    if policy.network_mode == NetworkMode.ALLOWLIST and others:
        raise ValueError(f"Interceptor's trial network reaches only the model endpoint ({model_host}): the "
                         f"allow-list's {others} are not honoured here")
