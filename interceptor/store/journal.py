"""A write-ahead journal of live rollouts, so that a crash loses at most the turns in flight.

Beside the record file `R` the server appends one JSON line per event to segments `R.journal.000001`, ...:
`open` (a rollout began), `turn` (a committed turn: the branch's new prompt ids, sampled ids and logprobs, and the
trace entry), `answer` (a submission) and `finish` (its record is on disk in `R`). Lines are written with one
unbuffered `os.write` each, so they survive the process being killed (kill -9); they are not fsynced per turn, so
a power cut can lose the last moments (finished records are fsynced by the recorder). A segment is deleted once
every rollout with a line in it has finished; a new one starts past `segment_bytes`.

`recover_journal(R)` reads the segments left by a server that did not shut down cleanly and rebuilds every
rollout that was opened and not finished as a record with status `interrupted`: its completed turns' samples
exactly as recorded, its trace and answer, and no reward. A torn last line (the write in flight at the crash) is
skipped. A rollout whose record is already in `R` is left out: a kill between the record's fsync and its `finish`
line leaves it unfinished here but finished there, and each rollout is written once. The server writes those
records to `R` at start-up and then removes the old segments. Only the server that holds `R`'s lock
(`record_lock.py`) reads or writes its journal.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from interceptor.gate.branch_record import BranchRecord, Lineage, build_samples
from interceptor.store.recorder import recorded_ids
from interceptor.store.records import Failure, RolloutRecord, TurnRecord
from interceptor.store.trace_log import Spot
from interceptor.tokens.ids_json import IdsJson

__all__ = ["Journal", "JournalError", "recover_journal", "journal_segments"]

log = logging.getLogger("interceptor.store.journal")

_SEGMENT_BYTES = 64 * 1024 * 1024  # a segment is closed past this size, and deleted when its rollouts finished


def _turn_head(rollout_id: str) -> bytes:
    return b'{"e":"turn","id":' + orjson.dumps(rollout_id) + b',"trace":'


class JournalError(Exception):
    """A journal line is not where the rollout's trace says it is (the journal was changed under the server)."""


def journal_segments(record_path: Path) -> list[Path]:
    """The journal segments beside `record_path`, oldest first."""
    record_path = Path(record_path)
    prefix = record_path.name + ".journal."
    found = [p for p in record_path.parent.glob(prefix + "*") if p.name[len(prefix):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(prefix):]))


class Journal:
    def __init__(self, record_path: Path, *, segment_bytes: int = _SEGMENT_BYTES) -> None:
        self._record_path = Path(record_path)
        self._segment_bytes = segment_bytes
        existing = journal_segments(self._record_path)
        self._number = int(existing[-1].name.rsplit(".", 1)[1]) if existing else 0
        self._fd = -1
        self._size = 0
        self._live_in: dict[int, set[str]] = {}  # segment number -> rollouts with a line in it, not finished
        self._open_segment()

    def _segment_path(self, number: int) -> Path:
        return self._record_path.with_name(f"{self._record_path.name}.journal.{number:06d}")

    def _open_segment(self) -> None:
        self._number += 1
        self._fd = os.open(self._segment_path(self._number), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = 0
        self._live_in[self._number] = set()

    def _write(self, rollout_id: str, event: dict) -> None:
        self._append(rollout_id, orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def _append(self, rollout_id: str, line: bytes) -> int:
        """Write `line` whole; the offset in the current segment where it starts."""
        offset = self._size
        os.write(self._fd, line)
        self._size += len(line)
        self._live_in[self._number].add(rollout_id)
        return offset

    def _rotate_if_full(self) -> None:
        if self._size > self._segment_bytes:
            os.close(self._fd)
            self._open_segment()
            self._drop_finished_segments()

    def opened(self, *, rollout_id: str, mode: str, metadata: dict, started_at: float) -> None:
        self._write(rollout_id, {"e": "open", "id": rollout_id, "mode": mode, "metadata": metadata,
                                 "started_at": started_at})
        self._rotate_if_full()

    def turn(self, rollout_id: str, *, branch: dict | None, trace: dict, usage: tuple[int, int]) -> Spot:
        """A committed turn (`branch` None: a black_box call, its trace entry only); where its trace entry lies,
        to read it back (`traces`). The entry comes right after the rollout's id, so it is read without the rest."""
        head = _turn_head(rollout_id)
        entry = orjson.dumps(trace, option=orjson.OPT_SERIALIZE_NUMPY)
        rest = orjson.dumps({"branch": branch, "usage": usage}, option=orjson.OPT_SERIALIZE_NUMPY)
        offset = self._append(rollout_id, b"".join((head, entry, b",", rest[1:], b"\n")))
        spot = (self._number, offset + len(head), len(entry))
        self._rotate_if_full()
        return spot

    def trace(self, rollout_id: str, *, trace: dict, usage: tuple[int, int]) -> Spot:
        """A black_box call: its trace entry only."""
        return self.turn(rollout_id, branch=None, trace=trace, usage=usage)

    def traces(self, rollout_id: str, spots: list[Spot]) -> list[dict]:
        """The trace entries of `rollout_id`'s turns at `spots` (before it finished: its segments are kept)."""
        head = _turn_head(rollout_id)
        out: list[dict] = []
        fds: dict[int, int] = {}
        try:
            for number, offset, length in spots:
                try:
                    if number not in fds:
                        fds[number] = os.open(self._segment_path(number), os.O_RDONLY)
                    data = os.pread(fds[number], len(head) + length, offset - len(head))
                    entry = orjson.loads(data[len(head):]) if data.startswith(head) else None
                except (OSError, orjson.JSONDecodeError) as exc:
                    raise JournalError(f"journal segment {number}: {exc}") from exc
                if not isinstance(entry, dict):
                    raise JournalError(f"journal segment {number} holds no turn of rollout {rollout_id} at {offset}")
                out.append(entry)
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def answered(self, rollout_id: str, answer: object) -> None:
        self._write(rollout_id, {"e": "answer", "id": rollout_id, "answer": answer})
        self._rotate_if_full()

    def finished(self, rollout_id: str) -> None:
        line = orjson.dumps({"e": "finish", "id": rollout_id}) + b"\n"
        os.write(self._fd, line)
        self._size += len(line)  # the offsets of the lines after it (`traces` reads at them)
        for live in self._live_in.values():
            live.discard(rollout_id)
        self._drop_finished_segments()

    def _drop_finished_segments(self) -> None:
        for number in [n for n, live in self._live_in.items() if not live and n != self._number]:
            del self._live_in[number]
            self._segment_path(number).unlink(missing_ok=True)

    def close(self, *, remove: bool) -> None:
        """Close the journal; `remove` deletes it (every rollout finished or was written as interrupted)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            for number in list(self._live_in):
                self._segment_path(number).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ recovery


@dataclass
class _Recovered:
    rollout_id: str
    mode: str
    metadata: dict
    started_at: float
    branches: dict[int, BranchRecord] = field(default_factory=dict)
    trace: list[dict] = field(default_factory=list)
    answer: object = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_at: float = 0.0

    def add_turn(self, branch: dict | None, trace: dict, usage: list[int]) -> None:
        self.trace.append(trace)
        self.prompt_tokens += usage[0]
        self.completion_tokens += usage[1]
        if branch is None:
            return
        number = branch["b"]
        record = self.branches.get(number)
        if record is None:
            origin = branch.get("o")
            lineage = Lineage(*branch["ln"]) if branch.get("ln") else None  # absent in journals from before lineages
            if origin is not None:
                record = self.branches[origin[0]].copy_through(origin[1], number=number, fork_reason=branch["fr"],
                                                               lineage=lineage)
                record.tools_digest, record.system_digest = branch["tk"], branch["sk"]
            else:
                record = BranchRecord(number=number, tools_digest=branch["tk"], system_digest=branch["sk"],
                                      fork_reason=branch["fr"], lineage=lineage)
            self.branches[number] = record
        turn = record.append_turn(IdsJson.of(branch["p"]), branch["t"], branch["l"],
                                  {k: v for k, v in branch["turn"].items() if k not in _POSITIONS})
        if turn != TurnRecord(**branch["turn"]):
            raise ValueError(f"branch {number}: the journal's turn positions do not follow from its ids")

    def to_record(self, reason: str) -> RolloutRecord:
        return RolloutRecord(
            rollout_id=self.rollout_id,
            mode=self.mode,
            status="interrupted",
            samples=build_samples([self.branches[n] for n in sorted(self.branches)]),
            trace=self.trace,
            usage={"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                   "turns": len(self.trace)},
            answer=self.answer,
            reward=None,
            failure=Failure(cause="interrupted", message=reason),
            events=[{"kind": "recovered_from_journal", "at": round(time.time(), 3)}],
            metadata=self.metadata,
            started_at=self.started_at,
            finished_at=time.time(),
        )


_POSITIONS = ("prompt_start", "completion_start", "completion_end")


def _lines(path: Path) -> Iterator[dict]:
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            if number == len(lines):  # no newline after it: the write in flight when the process died
                log.warning("%s: skipped a torn last line (%d bytes)", path, len(line))
            else:
                log.warning("%s:%d: skipped a line that is not JSON", path, number)


def recover_journal(record_path: Path) -> list[RolloutRecord]:
    """Records (status `interrupted`) for every rollout the journal shows opened and not finished, and the record
    file does not hold."""
    live: dict[str, _Recovered] = {}
    for segment in journal_segments(record_path):
        for event in _lines(segment):
            kind, rollout_id = event.get("e"), event.get("id")
            if kind == "open":
                live[rollout_id] = _Recovered(rollout_id=rollout_id, mode=event["mode"],
                                              metadata=event.get("metadata") or {}, started_at=event["started_at"])
            elif kind == "finish":
                live.pop(rollout_id, None)
            elif rollout_id in live:
                rollout = live[rollout_id]
                try:
                    if kind == "turn":
                        rollout.add_turn(event["branch"], event["trace"], event["usage"])
                    elif kind == "answer":
                        rollout.answer = event["answer"]
                except (KeyError, TypeError, IndexError, ValueError) as exc:
                    log.warning("journal event of rollout %s not understood: %r", rollout_id, exc)
    _drop_recorded(live, Path(record_path))
    reason = "the server stopped before the rollout finished; its completed turns were recovered from the journal"
    return [rollout.to_record(reason) for rollout in live.values()]


def _drop_recorded(live: dict[str, _Recovered], record_path: Path) -> None:
    """Leave out the rollouts whose record reached the record file before their `finish` line reached the journal."""
    if not live or not record_path.is_file():
        return
    recorded = live.keys() & recorded_ids(record_path)
    for rollout_id in recorded:
        del live[rollout_id]
    if recorded:
        log.warning("%d rollouts unfinished in the journal are already in %s (killed before their finish line); "
                    "not written again", len(recorded), record_path)
