"""Several replicas of the policy server, each rollout pinned to one of them for its life.

A rollout's turns resend its whole history, and the replica that generated its last turn holds that prefix in its
KV cache (vLLM's prefix caching), so every turn of a rollout goes to the same replica: the healthy one with the
fewest rollouts pinned (then the fewest requests in flight) when the rollout first needs one. Replicas are
health-checked (`/health` every `UpstreamConfig.health_interval_s`); a replica that fails a request (unreachable,
reset, a 5xx) or its health check is marked down, the turn goes on at another healthy replica within the turn's
attempt budget, and the replica's rollouts move at their next call: a prefix-cache miss, never a fork, since the
gate sends token ids (the trajectory is the same whichever replica generates). A down replica is back when its
health check passes; with none healthy, a rollout's own replica is still tried (it may be back already).

Per replica: rollouts pinned, requests in flight, turns served, failures and a moving mean of the turns' latency
(`stats()`, in the server's `/health`). With one replica this is the plain client: no health checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp

from interceptor.config import UpstreamConfig
from interceptor.errors import UpstreamUnavailable
from interceptor.store.records import Generation
from interceptor.transport.upstream import AttemptBudget, UpstreamClient, redact_url

__all__ = ["Replica", "ReplicaSet"]

log = logging.getLogger("interceptor.transport.replicas")
_LATENCY_WEIGHT = 0.2  # weight of the newest turn in the moving mean of a replica's latency
_ATTEMPTS_PER_REPLICA = 2  # of a turn's budget, before it moves on to another replica


@dataclass(eq=False)
class Replica:
    url: str
    client: UpstreamClient
    healthy: bool = True
    pinned: int = 0  # live rollouts pinned here
    in_flight: int = 0
    turns: int = 0
    failures: int = 0
    latency_s: float | None = None  # moving mean of a turn's upstream time

    def stats(self) -> dict:
        return {"url": redact_url(self.url), "healthy": self.healthy, "pinned_rollouts": self.pinned,
                "in_flight": self.in_flight, "turns": self.turns, "failures": self.failures,
                "latency_ms": None if self.latency_s is None else round(self.latency_s * 1000, 3)}


class ReplicaSet:
    """The policy servers of `config` (`base_url` and its `replicas`), as one client that routes by rollout."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.replicas = [Replica(url, UpstreamClient(replace(config, base_url=url, replicas=())))
                         for url in (config.base_url, *config.replicas)]
        self._pins: dict[str, Replica] = {}
        self.observe: Callable[[str, float], None] | None = None  # (replica, seconds) of each generation
        self._stack = AsyncExitStack()
        self._health: asyncio.Task | None = None

    async def __aenter__(self) -> ReplicaSet:
        async with AsyncExitStack() as stack:
            for replica in self.replicas:
                await stack.enter_async_context(replica.client)
            if len(self.replicas) > 1:
                self._health = asyncio.create_task(self._check_health(), name="replica-health")
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        await self._stack.aclose()

    # ------------------------------------------------------------------------------------ routing

    def replica_of(self, rollout_id: str) -> Replica | None:
        return self._pins.get(rollout_id)

    def release(self, rollout_id: str) -> None:
        """The rollout is over: it no longer counts toward its replica's load."""
        replica = self._pins.pop(rollout_id, None)
        if replica is not None:
            replica.pinned -= 1

    def _route(self, rollout_id: str | None, avoid: Replica | None = None) -> tuple[Replica, Replica | None]:
        """The replica for the rollout's next call, and the one it moved from (None when it did not move)."""
        pinned = self._pins.get(rollout_id) if rollout_id is not None else None
        if pinned is not None and pinned.healthy and pinned is not avoid:
            return pinned, None
        candidates = [r for r in self.replicas if r.healthy and r is not avoid]
        if not candidates:
            return (pinned or avoid or self.replicas[0]), None  # nothing healthy: try its own (it may be back)
        chosen = min(candidates, key=lambda r: (r.pinned, r.in_flight))
        if rollout_id is not None:
            if pinned is not None:
                pinned.pinned -= 1
            chosen.pinned += 1
            self._pins[rollout_id] = chosen
        return chosen, pinned

    # ------------------------------------------------------------------------------------ calls

    def new_budget(self) -> AttemptBudget:
        return AttemptBudget(total=self.config.attempts)

    async def models(self) -> list[dict]:
        replica = next((r for r in self.replicas if r.healthy), self.replicas[0])
        return await replica.client.models()

    async def complete(self, *, rollout_id: str | None = None, budget: AttemptBudget | None = None,
                       moved=None, **kwargs) -> Generation:
        """`UpstreamClient.complete` at the rollout's replica; on one that fails, at another healthy one within
        the turn's `budget`. `moved(from_url, to_url)` is told when the rollout changes replica."""
        budget = budget or self.new_budget()
        avoid: Replica | None = None
        while True:
            replica, previous = self._route(rollout_id, avoid)
            if previous is not None and moved is not None:
                moved(redact_url(previous.url), redact_url(replica.url))
            share = budget
            if len(self.replicas) > 1:  # a dead replica must not spend the whole turn's budget
                share = AttemptBudget(total=min(budget.total - budget.used, _ATTEMPTS_PER_REPLICA))
            replica.in_flight += 1
            try:
                generation = await replica.client.complete(budget=share, **kwargs)
            except UpstreamUnavailable:
                replica.failures += 1
                if share is not budget:
                    budget.used += share.used
                others = [r for r in self.replicas if r.healthy and r is not replica]
                if not others or budget.spent:
                    raise
                self._mark_down(replica, "a request failed")
                avoid = replica
                continue
            finally:
                replica.in_flight -= 1
            if share is not budget:
                budget.used += share.used
            replica.turns += 1
            seconds = generation.seconds
            replica.latency_s = seconds if replica.latency_s is None else (
                (1 - _LATENCY_WEIGHT) * replica.latency_s + _LATENCY_WEIGHT * seconds)
            if self.observe is not None:
                self.observe(redact_url(replica.url), seconds)
            return generation

    @asynccontextmanager
    async def relay(self, path: str, body: bytes, *, rollout_id: str | None = None,
                    **kwargs) -> AsyncIterator[aiohttp.ClientResponse]:
        """`UpstreamClient.relay` at the rollout's replica (black_box)."""
        replica, _ = self._route(rollout_id)
        replica.in_flight += 1
        try:
            async with replica.client.relay(path, body, **kwargs) as response:
                yield response
            replica.turns += 1
        finally:
            replica.in_flight -= 1

    def stats(self) -> list[dict]:
        return [replica.stats() for replica in self.replicas]

    # ------------------------------------------------------------------------------------ health

    def _mark_down(self, replica: Replica, why: str) -> None:
        if replica.healthy:
            log.warning("policy replica %s is down (%s); its rollouts move", redact_url(replica.url), why)
        replica.healthy = False

    async def _check_health(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await asyncio.gather(*(self._probe(replica) for replica in self.replicas))

    async def _probe(self, replica: Replica) -> None:
        url = replica.client.config.root + "/health"
        try:
            async with replica.client.session.get(
                url, timeout=aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
            ) as response:
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if ok and not replica.healthy:
            log.info("policy replica %s is back", redact_url(replica.url))
            replica.healthy = True
        elif not ok:
            self._mark_down(replica, "its health check failed")
