"""Durable JSON Lines storage of finished rollouts.

`Recorder.write` appends one rollout as one line and fsyncs before it returns, so a rollout reported finished is
on disk (live rollouts are in the journal, `journal.py`). Writes run in a worker thread (fsync blocks) and are
serialised so lines never interleave. A write that was torn by a crash (a last line with no newline) was never
acknowledged: on opening, the recorder moves it to `<file>.torn-<time>` and truncates the file to its last whole
line, so the next record starts on a fresh line. `read_records` reads a file back into the same types, skipping
a torn last line and reporting it through `on_torn` (a warning by default). `recorded_ids` reads only the rollout
ids, from the head of each line (crash recovery asks which rollouts a file already holds; it can be hundreds of MB).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from interceptor.store.records import RolloutRecord

__all__ = ["Recorder", "read_records", "recorded_ids"]


log = logging.getLogger("interceptor.store.recorder")


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()
        _set_aside_torn_tail(self.path)

    async def write(self, record: RolloutRecord) -> None:
        await self.write_line(record.to_json())

    async def write_line(self, line: bytes) -> None:
        """A record already serialised (`RolloutRecord.to_json`: one line, no newline)."""
        async with self._lock:
            await asyncio.to_thread(self._append, line + b"\n")

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _set_aside_torn_tail(path: Path) -> None:
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        start = size
        while start > 0:  # back to the byte after the last newline
            step = min(start, 1 << 16)
            f.seek(start - step)
            chunk = f.read(step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = start - step + cut + 1
                break
            start -= step
        f.seek(start)
        torn = f.read()
        aside = path.with_name(f"{path.name}.torn-{int(time.time())}")
        aside.write_bytes(torn)
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    log.warning("%s ended with a torn line (%d bytes, never acknowledged); moved it to %s", path, len(torn), aside)


def read_records(
    path: Path | str, *, on_torn: Callable[[int, int], None] | None = None
) -> Iterator[RolloutRecord]:
    """The records in `path`. A torn last line (a write cut off by a crash) is skipped and reported through
    `on_torn(line_number, byte_count)`; any other line that is not a record is an error."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = RolloutRecord.from_json_dict(orjson.loads(line))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                if not line.endswith(b"\n"):  # only the last line can lack one: a torn write
                    if on_torn is not None:
                        on_torn(number, len(line))
                    else:
                        log.warning("%s:%d: skipped a torn last line (%d bytes)", path, number, len(line))
                    return
                raise ValueError(f"{path}:{number}: not a rollout record: {exc}") from exc
            yield record



# orjson writes a dataclass's fields in their order, so a record line starts with its id (`RolloutRecord.to_json`).
_ID_HEAD = b'{"rollout_id":"'
_HEAD_BYTES = 256  # ids are short (16 hex digits); a line whose id does not end within this is parsed whole


def recorded_ids(path: Path | str) -> set[str]:
    """The rollout ids of the whole records in `path`. Only each line's head is read (the file is mapped, and the
    search for the next newline runs in C), so the samples, nearly all of a record's bytes, are never parsed. A
    line laid out otherwise (written by another tool) is parsed whole; a torn last line holds no record, and a line
    with no readable id is reported and passed over (`read_records` is the place that rejects it)."""
    ids: set[str] = set()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return ids  # an empty file cannot be mapped
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                rollout_id = _line_id(data, start, end)
                if rollout_id is not None:
                    ids.add(rollout_id)
                elif data[start:end].strip():
                    log.warning("%s: the line at byte %d holds no rollout id", path, start)
                start = end + 1
    return ids


def _line_id(data: mmap.mmap, start: int, end: int) -> str | None:
    head = data[start:min(end, start + _HEAD_BYTES)]
    if head.startswith(_ID_HEAD):
        close = head.find(b'"', len(_ID_HEAD))
        if close >= 0 and b"\\" not in head[:close]:  # no escapes: the bytes between the quotes are the id
            return head[len(_ID_HEAD):close].decode()
    try:
        line = orjson.loads(data[start:end])
    except orjson.JSONDecodeError:
        return None
    rollout_id = line.get("rollout_id") if isinstance(line, dict) else None
    return rollout_id if isinstance(rollout_id, str) else None
