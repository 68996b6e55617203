"""A live rollout's trace: one entry per chat call, in memory until the journal holds it, then only its place.

A turn's trace entry (the messages new to the call, the answer, the finish reason) is written in the turn's journal
line anyway (`journal.py`), so once that line is written the rollout keeps only where it lies: the segment, offset
and length, 24 bytes in an array, where a held entry costs a slotted object and its message list (~130 bytes a
turn; the message texts themselves are the trajectory's). The record's trace is read back from the journal when the
rollout finishes, before the journal lets its segments go: only each entry's bytes, which a turn line puts right
after the rollout's id (`Journal.turn`). Without a journal (no record file) entries stay held.

In black_box mode an entry is filled in while the call is relayed and spilled once its line is written.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator

__all__ = ["TraceLog", "Spot"]

Spot = tuple[int, int, int]  # segment number, offset, length of a journal line
_HELD = -1  # segment number of an entry that is still in memory


class TraceLog:
    __slots__ = ("_spots", "_held")

    def __init__(self) -> None:
        self._spots = array("q")  # three per entry: segment, offset, length (segment _HELD: in `_held`)
        self._held: dict[int, object] = {}  # index -> entry (a TurnTrace or a dict)

    def __len__(self) -> int:
        return len(self._spots) // 3

    def append(self, entry: object) -> int:
        """Hold `entry` as the next one; its index."""
        index = len(self)
        self._spots.extend((_HELD, 0, 0))
        self._held[index] = entry
        return index

    def spill(self, index: int, spot: Spot) -> None:
        """Entry `index` is in the journal at `spot`: drop it from memory."""
        self._spots[3 * index : 3 * index + 3] = array("q", spot)
        del self._held[index]

    def held_from_last(self, count: int) -> Iterator[tuple[int, object]]:
        """The held entries among the last `count`, last first."""
        last = len(self) - 1
        for index in range(last, max(last - count, -1), -1):
            if (entry := self._held.get(index)) is not None:
                yield index, entry

    def replace(self, index: int, entry: object) -> None:
        if index not in self._held:
            raise KeyError(f"trace entry {index} is not held")
        self._held[index] = entry

    def entries(self, read: Callable[[list[Spot]], list[dict]] | None, as_dict: Callable[[object], dict]) -> list[dict]:
        """Every entry as a dict, in order: held ones through `as_dict`, spilled ones read back by `read`."""
        spots = self._spots
        spilled = [i for i in range(len(self)) if spots[3 * i] != _HELD]
        if spilled and read is None:
            raise RuntimeError("trace entries are in a journal, but no journal reader was given")
        read_back = dict(zip(spilled, read([(spots[3 * i], spots[3 * i + 1], spots[3 * i + 2]) for i in spilled]),
                             strict=True)) if spilled else {}
        return [read_back[i] if i in read_back else as_dict(self._held[i]) for i in range(len(self))]
