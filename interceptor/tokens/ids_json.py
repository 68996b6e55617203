"""Token ids as a JSON array, serialised once: the upstream body, a branch's record and the journal line all take
these bytes.

A turn's prompt (`PromptJson`) is a branch's recorded parts, one per turn and never changed, plus the new ids: it
is joined into the upstream body once, where the body is made, so planning and recording a turn copy only its new
ids whatever the history's length.

A fork's ids are made so where its render runs (a worker thread for a large request), chunk by chunk
(`chunk_ids.py`), so no list of every id is ever built: on the event loop, serialising and freeing a 10 MB
conversation's 6.4M ids stalled every other rollout for ~150 ms, and while such a list lives, each pass of the
cyclic collector walks all of its items.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

__all__ = ["IdsJson", "PromptJson"]


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


@dataclass(frozen=True, slots=True)
class PromptJson:
    """A prompt of `count` ids: the first `through` of `recorded` (JSON text, one part per recorded turn: b"1,2"
    then b",3,4"; a list that only grows, so those stay as they are) followed by `new`."""

    recorded: list[bytes]
    through: int
    new: IdsJson
    count: int

    @classmethod
    def fresh(cls, ids: IdsJson) -> PromptJson:
        """A prompt with nothing recorded before it (a fork's full render)."""
        return cls([], 0, ids, ids.count)

    def body(self, head: bytes = b"", tail: bytes = b"") -> bytes:
        """`head`, the prompt as a JSON array, then `tail`: one copy of every byte."""
        comma = b"," if self.new.count and self.count > self.new.count else b""  # ids on both sides of it
        return b"".join((head, b"[", *self.recorded[: self.through], comma, self.new.inner(), b"]", tail))

    @property
    def json(self) -> bytes:
        """The prompt as a JSON array (b"[1,2,3,4]")."""
        return self.body()
