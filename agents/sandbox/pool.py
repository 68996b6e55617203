"""A warm pool: sandboxes made, entered and warmed ahead, so a rollout's start does not wait for one.

    async with SandboxPool(PoolConfig(size=2)) as pool:
        async with pool.sandbox("namespace", make_sandbox) as box:     # prepared, or made now when none is ready
            await box.run(launch, limits=...)                          # its process was started ahead (`warm`)

Sandboxes are kept per *kind* (a backend, a Docker image, a network setting: whatever `make` differs by), up to
`size` of each; taking one starts the making of its replacement in the background, one at a time per kind so a
2-core machine is not swamped. Every sandbox serves one rollout and is then thrown away: nothing one rollout wrote
is seen by the next. At most `kinds` kinds are kept warm; the least recently used beyond that are put away (a SWE
suite has one image per task, and a prepared container per image would otherwise pile up). A kind whose making
fails stops refilling until a sandbox of it is made again on demand, where the failure reaches the caller (and the
runner's circuit breaker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import Self

from agents.errors import AgentConfigError
from agents.sandbox.base import Sandbox

__all__ = ["PoolConfig", "SandboxPool"]

log = logging.getLogger("agents.sandbox.pool")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    size: int = 2  # prepared sandboxes kept per kind; 0: no pool (every sandbox made when needed)
    kinds: int = 4  # kinds kept prepared at once

    def __post_init__(self) -> None:
        if self.size < 0 or self.kinds < 1:
            raise AgentConfigError("pool size must be >= 0 and kinds >= 1")


class _Shelf:
    """The prepared sandboxes of one kind, and the task that makes more."""

    def __init__(self, make: Callable[[], Sandbox], size: int) -> None:
        self.make = make
        self.size = size
        self.ready: list[Sandbox] = []
        self.filling: asyncio.Task | None = None
        self.failed: str | None = None  # why the last making failed; no refilling until one is made on demand

    def refill(self) -> None:
        if self.failed is None and len(self.ready) < self.size and (self.filling is None or self.filling.done()):
            self.filling = asyncio.create_task(self._fill())

    async def _fill(self) -> None:
        while len(self.ready) < self.size:
            try:
                box = await prepare(self.make)
            except Exception as exc:  # noqa: BLE001  (kept as the shelf's state; the next take goes cold and raises)
                self.failed = str(exc) or type(exc).__name__
                log.warning("the warm pool stops refilling a kind: %s", self.failed)
                return
            self.ready.append(box)

    async def close(self) -> None:
        if self.filling is not None:
            self.filling.cancel()
            await asyncio.gather(self.filling, return_exceptions=True)
        boxes, self.ready = self.ready, []
        for box in boxes:
            with contextlib.suppress(Exception):
                await box.__aexit__(None, None, None)


async def prepare(make: Callable[[], Sandbox]) -> Sandbox:
    """A sandbox made, entered and warmed; on failure nothing of it is left."""
    box = make()
    await box.__aenter__()
    try:
        await box.warm()
    except BaseException:
        await asyncio.shield(box.__aexit__(None, None, None))
        raise
    return box


class SandboxPool:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self._shelves: OrderedDict[Hashable, _Shelf] = OrderedDict()
        self._open = False
        self.taken_warm = 0  # sandboxes handed out prepared
        self.taken_cold = 0  # made on demand (the pool was empty, disabled, or its kind failing)

    async def __aenter__(self) -> Self:
        self._open = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._open = False
        shelves, self._shelves = list(self._shelves.values()), OrderedDict()
        for shelf in shelves:
            await shelf.close()

    async def prefill(self, kind: Hashable, make: Callable[[], Sandbox]) -> None:
        """Start preparing sandboxes of `kind` now, before the first is asked for."""
        if self._open and self.config.size > 0:
            (await self._shelf(kind, make)).refill()

    def ready(self, kind: Hashable) -> int:
        """Sandboxes of this kind prepared now."""
        shelf = self._shelves.get(kind)
        return 0 if shelf is None else len(shelf.ready)

    @contextlib.asynccontextmanager
    async def sandbox(self, kind: Hashable, make: Callable[[], Sandbox]) -> AsyncIterator[Sandbox]:
        """A prepared sandbox of `kind` (made with `make` when none is ready), thrown away on exit."""
        box = await self._take(kind, make)
        try:
            yield box
        finally:
            await asyncio.shield(box.__aexit__(None, None, None))

    async def _take(self, kind: Hashable, make: Callable[[], Sandbox]) -> Sandbox:
        if not self._open or self.config.size == 0:
            self.taken_cold += 1
            return await prepare(make)
        shelf = await self._shelf(kind, make)
        box = shelf.ready.pop(0) if shelf.ready else None
        if box is None:
            self.taken_cold += 1
            box = await prepare(make)  # raises what the backend raises: the caller's circuit breaker hears of it
            shelf.failed = None
        else:
            self.taken_warm += 1
        shelf.refill()
        return box

    async def _shelf(self, kind: Hashable, make: Callable[[], Sandbox]) -> _Shelf:
        shelf = self._shelves.get(kind)
        if shelf is None:
            shelf = self._shelves[kind] = _Shelf(make, self.config.size)
            while len(self._shelves) > self.config.kinds:
                _, oldest = self._shelves.popitem(last=False)
                await oldest.close()
        self._shelves.move_to_end(kind)
        return shelf
