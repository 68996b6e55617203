"""Token ids as a JSON array, serialised once: the upstream body, a branch's record and the journal line all take
these bytes.

A fork's ids are made so where its render runs (a worker thread for a large request), chunk by chunk
(`chunk_ids.py`), so no list of every id is ever built: on the event loop, serialising and freeing a 10 MB
conversation's 6.4M ids stalled every other rollout for ~150 ms, and while such a list lives, each pass of the
cyclic collector walks all of its items.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

__all__ = ["IdsJson"]


@dataclass(frozen=True, slots=True)
class IdsJson:
    """Ids as the JSON array `json` (b"[1,2,3]") of `count` ids."""

    json: bytes  # b"[1,2,3]"
    count: int

    @classmethod
    def of(cls, ids: list[int]) -> IdsJson:
        return cls(orjson.dumps(ids), len(ids))

    def inner(self) -> memoryview:
        """The ids without the brackets (b"1,2,3"), not copied."""
        return memoryview(self.json)[1:-1]
