"""A circuit breaker for a sandbox backend (the runner keeps one per backend and per task image): stop burning
rollouts on a backend that keeps failing.

After `threshold` failures in a row to make a sandbox, the circuit opens: new rollouts wait (they are not failed)
for `cooldown_s`, then are let through again. A success closes the circuit; another failure opens it for another
cooldown. So a broken backend costs `threshold` failed rollouts (plus those already starting), not the whole run,
and a backend that comes back is used again without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

__all__ = ["BreakerConfig", "CircuitBreaker"]

log = logging.getLogger("agents.sandbox.breaker")


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    threshold: int = 3  # sandbox failures in a row that open the circuit
    cooldown_s: float = 30.0  # how long new rollouts wait once it is open

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.cooldown_s < 0:
            raise ValueError("threshold must be at least 1 and cooldown_s not negative")


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self._failures = 0  # in a row
        self._open_until = 0.0  # time.monotonic()
        self.times_opened = 0

    @property
    def is_open(self) -> bool:
        return time.monotonic() < self._open_until

    async def admit(self) -> float:
        """Wait while the circuit is open; returns how long this caller waited."""
        waited = 0.0
        while (remaining := self._open_until - time.monotonic()) > 0:
            await asyncio.sleep(remaining)
            waited += remaining
        return waited

    def succeeded(self) -> None:
        self._failures = 0

    def failed(self, reason: str) -> None:
        self._failures += 1
        if self._failures >= self.config.threshold:
            self._open_until = time.monotonic() + self.config.cooldown_s
            self.times_opened += 1
            log.warning("%d sandbox failures in a row (last: %s): new rollouts wait %.0f s",
                        self._failures, reason, self.config.cooldown_s)
