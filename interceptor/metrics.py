"""Operators' metrics of an interception server, for Prometheus (`GET /metrics`, `prometheus-client`).

Counted as they happen: chat calls answered (by mode and dialect), prompt and sampled tokens, the upstream time of
each generation (a histogram per policy replica), finished rollouts by status and failure cause (infrastructure
faults are causes, never rewards), changes refused before grading and limits boxes ran into (egress refusals
among them). Read when scraped: live rollouts, requests in flight, whether weights are being
swapped (turns held), the policy version, and per replica its health, pinned rollouts and requests in flight.
Training curves stay with trackio (`interceptor train`); this is for watching a running server.

Each server has its own registry (several servers in one process do not mix). With an admin token configured,
`/metrics` asks for it as the admin API does (a Bearer token, which Prometheus sends with `authorization`); a
server without one serves `/metrics` to anyone who can reach its port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from interceptor.server import InterceptionServer

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ServerMetrics:
    def __init__(self, server: InterceptionServer) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.turns = Counter("interceptor_turns", "Chat calls answered.", ["mode", "dialect"], registry=self.registry)
        self.prompt_tokens = Counter("interceptor_prompt_tokens", "Prompt tokens of the turns generated.",
                                     registry=self.registry)
        self.sampled_tokens = Counter("interceptor_sampled_tokens", "Tokens the policy sampled.",
                                      registry=self.registry)
        self.upstream_seconds = Histogram("interceptor_upstream_seconds", "Time of one generation upstream.",
                                          ["replica"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rollouts_finished = Counter("interceptor_rollouts_finished", "Rollouts finished, by status and cause.",
                                         ["status", "cause"], registry=self.registry)
        self.tampering = Counter("interceptor_tampering", "Changes of agents refused before grading, by kind.",
                                 ["kind"], registry=self.registry)
        self.limits_hit = Counter("interceptor_limits_hit", "What boxes ran into: refused forks, connections, egress.",
                                  ["limit"], registry=self.registry)
        self.registry.register(_State(server))

    def observe_events(self, events: list[dict]) -> None:
        """A finished rollout's events: its refused changes (`tampering`) by kind, the limits its box ran into
        (`limit_hit`: memory, pids, disk, connections, egress) by limit."""
        for event in events:
            if event.get("kind") == "tampering":
                for kind, count in (event.get("counts") or {}).items():
                    self.tampering.labels(kind).inc(count)
            elif event.get("kind") == "limit_hit" and isinstance(event.get("count"), int):
                self.limits_hit.labels(str(event.get("limit"))).inc(event["count"])

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_turn(self, result) -> None:
        """A turn the gate answered (its `TurnResult`): its tokens."""
        self.prompt_tokens.inc(result.prompt_tokens)
        self.sampled_tokens.inc(result.completion_tokens)

    def route(self, admin_token: str | None):
        """The `GET /metrics` handler: the admin token asked for when one is configured."""
        from aiohttp import web

        from interceptor.admin import authorize_admin

        async def metrics(request: web.Request) -> web.Response:
            if admin_token is not None:
                authorize_admin(request, admin_token)
            return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        return metrics


class _State:
    """The gauges, read from the server when scraped."""

    def __init__(self, server: InterceptionServer) -> None:
        self._server = server

    def describe(self):
        return []

    def collect(self):
        server = self._server
        live = server.registry.live()
        yield GaugeMetricFamily("interceptor_live_rollouts", "Rollouts open.", value=len(live))
        yield GaugeMetricFamily("interceptor_requests_in_flight", "Chat calls being answered.",
                                value=sum(r.in_flight for r in live))
        budget = server.body_limits.budget
        if budget is not None:
            yield GaugeMetricFamily("interceptor_pending_body_bytes", "Declared bytes of request bodies still arriving.",
                                    value=budget.held)
            yield CounterMetricFamily("interceptor_body_budget_refused", "Requests refused (503) for bodies in flight "
                                      "past max_pending_body_bytes.", value=budget.refused)
        policy = server.policy
        if policy is not None:
            yield GaugeMetricFamily("interceptor_policy_version", "The policy version turns are stamped with.",
                                    value=policy.version)
            yield GaugeMetricFamily("interceptor_weights_swapping", "1 while a weight sync holds new turns.",
                                    value=0 if policy.ready.is_set() else 1)
        healthy = GaugeMetricFamily("interceptor_replica_healthy", "1 when the replica is up.", labels=["replica"])
        pinned = GaugeMetricFamily("interceptor_replica_pinned_rollouts", "Live rollouts pinned to the replica.",
                                   labels=["replica"])
        in_flight = GaugeMetricFamily("interceptor_replica_in_flight", "Generations in flight at the replica.",
                                      labels=["replica"])
        for replica in server.replicas.stats():
            healthy.add_metric([replica["url"]], 1 if replica["healthy"] else 0)
            pinned.add_metric([replica["url"]], replica["pinned_rollouts"])
            in_flight.add_metric([replica["url"]], replica["in_flight"])
        yield from (healthy, pinned, in_flight)
