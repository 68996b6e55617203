"""Typed reads of JSON request fields: a missing or null field gives the default; a wrong type is a 400 that names
the field (JSON `true` is not an integer here, although Python's bool is an int)."""

from __future__ import annotations

from trainer.engine.errors import InvalidRequest

__all__ = ["is_int", "read_bool", "read_float", "read_int", "read_int_list", "read_str"]


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_int(body: dict, name: str, *, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise InvalidRequest(f"`{name}` must be an integer, got {value!r}", param=name)
    return value


def read_float(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"`{name}` must be a number, got {value!r}", param=name)
    return float(value)


def read_bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"`{name}` must be a boolean, got {value!r}", param=name)
    return value


def read_str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"`{name}` must be a string, got {value!r}", param=name)
    return value


def read_int_list(body: dict, name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise InvalidRequest(f"`{name}` must be a list of integers, got {value!r}", param=name)
    return tuple(dict.fromkeys(value))
