"""What request bodies still on their way may hold of the server's memory, all connections together.

    budget = BodyBudget(limit_bytes=config.max_pending_body_bytes)
    if not budget.take(content_length): ...answer 503 (`errors.Overloaded`) and close...
    ...the body arrives whole (or the connection goes)...
    budget.give(content_length)

A request's declared length is taken from the budget when its head is read and its body is not all there, and given
back once the body is whole or the connection is gone. Declared, not received: a client that announces 15 MB and
sends it a byte at a time holds 15 MB of the budget from its first byte, which is what it may come to hold. Twelve
stalled 15 MB bodies held 165 MB of a server before there was a budget; now the bodies in flight hold at most
`limit_bytes`, and the request that would pass it gets a 503 (the SDKs retry one) and its connection closed. A
body that arrives in one read takes nothing: it is whole when its head is read. The fast lane takes from it as it
reads (`lane.py`), and `request_body.read_body` for the requests aiohttp reads (chunked ones take the body limit).
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

from interceptor.errors import Overloaded

__all__ = ["BodyBudget"]


class BodyBudget:
    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held = 0
        self.refused = 0  # requests turned away: each is an event (`/metrics`)

    def take(self, count: int) -> bool:
        if self.held + count > self.limit_bytes:
            self.refused += 1
            return False
        self.held += count
        return True

    def give(self, count: int) -> None:
        self.held -= count

    @contextmanager
    def holding(self, count: int) -> Iterator[None]:
        """`count` bytes held while the block reads a body; Overloaded when the budget does not have them."""
        if not self.take(count):
            raise Overloaded(self.refusal(count))
        try:
            yield
        finally:
            self.give(count)

    def refusal(self, count: int) -> str:
        return (f"the server is receiving {self.held:,} bytes of request bodies already; this one's {count:,} would "
                f"pass its limit of {self.limit_bytes:,}: retry")
