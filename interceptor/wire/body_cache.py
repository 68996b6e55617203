"""A rollout's recent request bodies, so that the next body is parsed only where it differs: O(new bytes).

Agents resend their whole history every turn, byte for byte, with a few messages appended. `BodyCache.read(raw)`
finds the longest run of leading history elements (`messages`, or `input` for Responses) whose bytes equal a
recent body's, up to one of that body's last `_BOUNDARIES_KEPT` element boundaries; those elements are the same
parsed objects as before. Only the bytes after them are parsed: `[0` + the rest of the array, or, when the
fields after the array changed too, `{"messages":[0` + the rest of the body (the fields before the array lie in
the identical prefix, so their values are the recent body's). When nothing outside the array changed, every
other field is the same object as before (the tool list among them), so a dialect may reuse what it derived
from them (`ParsedBody.same_rest`). "Changed" is by value, types included: Codex writes its `client_metadata`
map in a new key order every request, and its conversion would otherwise start over every turn.

A body is not kept, only a digest of its bytes up to each of those boundaries (`digests.py`) and of the bytes
after its array: the message
text is held once, in the parsed elements, and a match costs one pass of the hash over the new body's prefix
(3 µs for 32k tokens of history). A body that rewrites an older element (a compaction) matches nothing and is
parsed whole, as a first request is.

Why this is exact: JSON is read left to right, so two bodies with identical bytes up to an element boundary
are in the same parser state there, and the rest parsed in that state is the rest of the body. Element
boundaries come from a structural scan (strings, brackets and braces, `_TOKEN`) of bytes that `orjson` accepted,
and the scan's element count must equal the parsed array's length, else the body is not cached. A body with a
second top-level history key after the array is parsed whole.

The retry fingerprint is a hash chain over the elements' bytes plus the bytes after the array: the same for the
same body whichever recent body it was matched against, and O(new bytes + the fields after the array) to compute.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass

import orjson

from interceptor.digests import digest, hasher
from interceptor.wire.shared_values import share

__all__ = ["BodyCache", "ParsedBody"]

# A JSON string (with an optional ':' when it is a key), or a bracket or brace. Everything else is skipped.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(?:[ \t\r\n]*:)?|[{}\[\]]')
_QUOTE, _OPEN_OBJECT, _OPEN_ARRAY, _COLON = ord('"'), ord("{"), ord("["), ord(":")
_STATES_KEPT = 2  # lineages of requests per dialect (a main conversation and a side request such as a title)
# Element boundaries a body is matched at, from its last: an agent appends to its history, and Claude Code also
# moves its `cache_control` marks off the last user messages, which changes those (compactions parse whole).
_BOUNDARIES_KEPT = 8


@dataclass(frozen=True, slots=True, eq=False)
class _Layout:
    """Where a body's history array lies: the offset after `[`, the offset after each element, that of `]`. Offsets
    and hashes per element are machine integers (`array`), not Python ints: an idle rollout holds them."""

    start: int
    ends: array  # of "q"
    close: int


@dataclass(slots=True, eq=False)
class _State:
    """A body already read: its layout, the digests of its prefixes, the bytes after its array, its parsed parts
    and what a dialect derived from it."""

    prefixes: list[tuple[int, bytes]]  # (n, digest of the bytes up to the end of element n), the last element first
    tail: tuple[int, bytes]  # the length and digest of the bytes from the array's `]` to the end
    layout: _Layout
    elements: list
    head: dict  # the fields before the array
    rest: dict  # every field but the array, as the whole body parses them
    chain: array  # of "q"; chain[i]: hash of the bytes before the array and of its first i elements
    derived: object = None
    rest_digest: bytes | None = None  # of `rest` written with sorted keys, once a body's tail bytes differed

    def digest_of_rest(self) -> bytes:
        if self.rest_digest is None:
            self.rest_digest = _canonical_digest(self.rest)
        return self.rest_digest


@dataclass(frozen=True, slots=True, eq=False)
class ParsedBody:
    """One body, read. `reused` leading elements are the same objects as in `previous`'s body, and `same_rest`
    says every other field is too; `fingerprint` identifies the body's bytes (retries resend the same bytes)."""

    body: dict
    reused: int
    same_rest: bool
    previous: object  # what the dialect derived from the body matched against (None when none was)
    fingerprint: int
    _state: _State | None
    _source: _State | None = None


class BodyCache:
    def __init__(self, key: str = "messages") -> None:
        self._key = key
        self._key_token = b'"%s"' % key.encode()  # (orjson.dumps returns a 4 KB buffer for it, kept per rollout)
        self._states: list[_State] = []  # most recent first

    def read(self, raw: bytes) -> ParsedBody:
        """Parse `raw` (orjson's errors propagate, as for a whole-body parse)."""
        for state in self._states:
            reused = _matching_elements(state, raw)
            if reused:
                try:
                    parsed = self._extend(state, raw, reused)
                except orjson.JSONDecodeError:
                    break  # the whole parse below reports the error where it is in `raw`
                if parsed is not None:
                    return parsed
        return self._read_whole(raw)

    def extends_recent(self, raw: bytes) -> bool:
        """Whether `raw` repeats the most recent body's whole history array (cheap: one digest)."""
        if not self._states or not self._states[0].prefixes:
            return False
        state = self._states[0]
        count, kept = state.prefixes[0]
        return _digest(raw, state.layout.ends[count - 1]) == kept

    def keep(self, parsed: ParsedBody, derived: object) -> None:
        """Remember `parsed` (which the dialect accepted) and what the dialect derived from it."""
        state = parsed._state
        if state is None:
            return
        state.derived = derived
        kept = [s for s in self._states if s is not parsed._source]  # a body replaces the one it extends
        self._states = [state, *kept][:_STATES_KEPT]

    # ------------------------------------------------------------------------------------------ internals

    def _read_whole(self, raw: bytes) -> ParsedBody:
        body = orjson.loads(raw)
        state = None
        if isinstance(body, dict) and isinstance(body.get(self._key), list):
            for field, value in body.items():  # the tools and system prompt every rollout of an agent sends
                if field != self._key:
                    body[field] = share(value)
            state = self._state_of_whole(raw, body)
        fingerprint = _fingerprint(raw, state)
        return ParsedBody(body=body, reused=0, same_rest=False, previous=None, fingerprint=fingerprint, _state=state)

    def _state_of_whole(self, raw: bytes, body: dict) -> _State | None:
        found = _layout(raw, self._key_token)
        if found is None:
            return None
        layout, key_at = found
        elements = body[self._key]
        if len(layout.ends) != len(elements) or raw.find(self._key_token, layout.close) >= 0:
            return None  # not a plain array of objects, or the key again after it: nothing to gain, parse whole
        head = orjson.loads(raw[:key_at] + self._key_token + b":0}")
        head.pop(self._key)
        head = {field: body[field] for field in head}  # the same (shared) objects as the body's
        rest = {k: v for k, v in body.items() if k != self._key}
        return _State(prefixes=_prefixes(raw, layout.ends), tail=_tail(raw, layout.close), layout=layout,
                      elements=elements, head=head, rest=rest, chain=_chain(raw, layout))

    def _extend(self, state: _State, raw: bytes, reused: int) -> ParsedBody | None:
        boundary = state.layout.ends[reused - 1]
        scanned = _scan_elements(raw, boundary)
        if scanned is None:
            return None
        new_ends, close = scanned
        old = state.layout
        tail = _tail(raw, close)
        same_rest = tail == state.tail
        rest_digest = state.rest_digest
        if same_rest:
            added = orjson.loads(b"[0" + raw[boundary: close + 1])
            rest = state.rest
        else:
            if raw.find(self._key_token, close) >= 0:
                return None
            after = orjson.loads(b"{" + self._key_token + b":[0" + raw[boundary:])
            added = after.pop(self._key)
            rest = {**state.head, **after}
            rest_digest = _canonical_digest(rest)
            if rest_digest == state.digest_of_rest():  # the same values, another key order (Codex's metadata map)
                rest, same_rest = state.rest, True
        added = added[1:]
        if len(added) != len(new_ends):
            return None  # an element that is not an object: the dialect will say so after a whole parse
        elements = state.elements[:reused] + added
        layout = _Layout(start=old.start, ends=old.ends[:reused] + new_ends, close=close)
        chain = _extend_chain(state.chain[: reused + 1], raw, layout, reused)
        new_state = _State(prefixes=_prefixes(raw, layout.ends), tail=tail, layout=layout,
                           elements=elements, head=state.head, rest=rest, chain=chain, rest_digest=rest_digest)
        body = {**rest, self._key: elements}
        return ParsedBody(body=body, reused=reused, same_rest=same_rest, previous=state.derived,
                          fingerprint=_fingerprint(raw, new_state), _state=new_state, _source=state)  # fmt: skip


def _matching_elements(state: _State, raw: bytes) -> int:
    """How many leading elements of `state`'s array `raw` repeats byte for byte, up to one of the boundaries whose
    digest is kept (0 if none)."""
    ends = state.layout.ends
    for count, kept in state.prefixes:  # the last boundary first
        if ends[count - 1] <= len(raw) and _digest(raw, ends[count - 1]) == kept:
            return count
    return 0


def _digest(raw: bytes, end: int) -> bytes:
    return digest(memoryview(raw)[:end])


def _canonical_digest(value: dict) -> bytes:
    """Equal for two values that are the same JSON whatever their objects' key order, and unequal where a value's
    type differs (`1`, `1.0` and `true` are written apart; Python's `==` would hold them equal)."""
    return digest(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _tail(raw: bytes, close: int) -> tuple[int, bytes]:
    return len(raw) - close, digest(memoryview(raw)[close:])


def _prefixes(raw: bytes, ends: array) -> list[tuple[int, bytes]]:
    """(element count, digest of `raw` up to that element's end) for the last `_BOUNDARIES_KEPT` elements, the last
    first, in one pass over the bytes."""
    running, done, out = hasher(), 0, []
    view = memoryview(raw)
    for count in range(max(1, len(ends) - _BOUNDARIES_KEPT + 1), len(ends) + 1):
        running.update(view[done:ends[count - 1]])
        done = ends[count - 1]
        out.append((count, running.digest()))
    return out[::-1]


def _layout(raw: bytes, key_token: bytes) -> tuple[_Layout, int] | None:
    """The history array's layout and the offset of its key, scanning top-level keys up to it."""
    depth = 0
    for match in _TOKEN.finditer(raw):
        start, end = match.span()
        first = raw[start]
        if first == _QUOTE:
            if depth == 1 and raw[end - 1] == _COLON and raw[start:end - 1].rstrip() == key_token:
                opening = _next_non_space(raw, end)
                if opening < 0 or raw[opening] != _OPEN_ARRAY:
                    return None
                scanned = _scan_elements(raw, opening + 1)
                if scanned is None:
                    return None
                ends, close = scanned
                return _Layout(start=opening + 1, ends=ends, close=close), start
        elif first in (_OPEN_OBJECT, _OPEN_ARRAY):
            depth += 1
        else:
            depth -= 1
    return None


def _scan_elements(raw: bytes, position: int) -> tuple[array, int] | None:
    """From `position` inside the history array: the offset after each element that is an object or an array,
    and the offset of the array's `]`; None if the bytes end first."""
    depth, ends = 0, array("q")
    for match in _TOKEN.finditer(raw, position):
        start, end = match.span()
        first = raw[start]
        if first == _QUOTE:
            continue
        if first in (_OPEN_OBJECT, _OPEN_ARRAY):
            depth += 1
            continue
        depth -= 1
        if depth == 0:
            ends.append(end)
        elif depth < 0:
            return ends, start
    return None


def _next_non_space(raw: bytes, position: int) -> int:
    for i in range(position, len(raw)):
        if raw[i] not in b" \t\r\n":
            return i
    return -1


def _chain(raw: bytes, layout: _Layout) -> array:
    return _extend_chain(array("q", [hash(raw[: layout.start])]), raw, layout, 0)


def _extend_chain(chain: array, raw: bytes, layout: _Layout, known: int) -> array:
    ends = layout.ends
    start = ends[known - 1] if known else layout.start
    for i in range(known, len(ends)):
        chain.append(hash((chain[-1], raw[start: ends[i]])))
        start = ends[i]
    return chain


def _fingerprint(raw: bytes, state: _State | None) -> int:
    if state is None:
        return hash(raw)
    return hash((state.chain[-1], raw[state.layout.ends[-1] if state.layout.ends else state.layout.start:]))
