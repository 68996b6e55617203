"""Values that many rollouts send alike, held once in the process.

Every rollout of an agent sends the same tool list and system prompt (tens of KB for real agents), and each parsed
its own copy and kept it for its life. `share(value)` returns the process's one object equal to `value` byte for
byte (its key is the digest of its JSON in key order, `digests.py`), or `value` itself, which becomes that object.
The values are JSON read from requests or converted from them, which the server never mutates (it builds new
objects instead), so sharing them is safe; and a shared tool list is also the same object for the renderer's
`tojson` memo (`rendering.py`), which then serialises it once for all rollouts. Small values are returned as they
are (not worth a lookup); the most recently shared `_KEPT` values are kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TypeVar

import orjson

from interceptor.digests import digest

__all__ = ["share"]

T = TypeVar("T")
_KEPT = 256
_SMALL = 512  # bytes of JSON below which a value is returned as it is
_values: OrderedDict[bytes, object] = OrderedDict()
_lock = threading.Lock()  # bodies above 16 KiB are read in worker threads


def share(value: T) -> T:
    if not isinstance(value, (dict, list, str)) or not value:
        return value
    if isinstance(value, str):
        if len(value) < _SMALL:
            return value
        key = b"s" + digest(value.encode("utf-8", "surrogatepass"))
    else:
        try:
            text = orjson.dumps(value)
        except orjson.JSONEncodeError:
            return value  # the dialect reports it
        if len(text) < _SMALL:
            return value
        key = (b"d" if isinstance(value, dict) else b"l") + digest(text)
    with _lock:
        kept = _values.get(key)
        if kept is not None:
            _values.move_to_end(key)
            return kept  # type: ignore[return-value]
        _values[key] = value
        if len(_values) > _KEPT:
            _values.popitem(last=False)
    return value
