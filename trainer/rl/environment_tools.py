"""What makes a method a safe tool for TRL's tool loop: argument validation, bounded text, workspace paths.

TRL (1.16, `GRPOTrainer._tool_call_loop`) calls a tool as `method(**arguments)` with the arguments the model wrote,
and turns an exception into `{"error": str(exc)}`. `@tool` does that conversion itself, so the model always sees a
tool error of one shape (`error: ...`) and a malformed call never reaches the method's body:

- a missing or unexpected argument (the signature is bound first: nothing is defaulted silently);
- an argument of the wrong JSON type (checked against the annotation: `str`, `int`, `bool`);
- `ToolError` raised by the body (a path escaping the workspace, content over the limit, an ended episode).

The wrapper keeps the method's signature, annotations and Google-style docstring (`functools.wraps`), which is what
`transformers.utils.get_json_schema` reads to render the tool's schema in the prompt.
"""

from __future__ import annotations

import functools
import inspect
import os
import typing
from collections.abc import Callable
from pathlib import Path

__all__ = ["ToolError", "bounded", "tool", "workspace_path"]


class ToolError(Exception):
    """A tool call the model made cannot run; the message is what the model reads."""


def tool(method: Callable[..., str]) -> Callable[..., str]:
    """A method whose malformed calls come back to the model as `error: ...` strings instead of raising."""
    signature = inspect.signature(method)
    hints = typing.get_type_hints(method)

    @functools.wraps(method)
    def checked(self, *args: object, **kwargs: object) -> str:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as exc:  # missing or unexpected arguments, as Python words it
            return f"error: {method.__name__}: {exc}"
        try:
            for name, value in bound.arguments.items():
                _check_type(name, value, hints.get(name))
            return method(*bound.args, **bound.kwargs)
        except ToolError as exc:
            return f"error: {method.__name__}: {exc}"

    return checked


def _check_type(name: str, value: object, expected: object) -> None:
    if expected is None or expected is str and isinstance(value, str):
        return
    if expected is int and isinstance(value, int) and not isinstance(value, bool):
        return
    if expected is bool and isinstance(value, bool):
        return
    if expected not in (str, int, bool):
        return  # `self` and any richer annotation: not an argument the model writes
    raise ToolError(f"argument {name!r} must be a {_JSON_NAMES[expected]}, not {_json_type(value)}")


_JSON_NAMES = {str: "string", int: "integer", bool: "boolean"}


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def bounded(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its start and its end, with a note of how much was cut."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def workspace_path(workspace: Path, path: str) -> Path:
    """`path` (relative to the workspace, or absolute inside it) as a host path inside `workspace`, following
    symbolic links: a path that leaves the workspace by `..`, by being absolute elsewhere, or through a link the
    model made is refused."""
    if not path.strip():
        raise ToolError("the path is empty")
    if "\x00" in path:
        raise ToolError("the path contains a NUL character")
    root = workspace.resolve()
    candidate = Path(path) if os.path.isabs(path) else root / path
    resolved = candidate.resolve()  # follows links that exist; the rest is normalised lexically
    if not resolved.is_relative_to(root):
        raise ToolError(f"{path!r} is outside the workspace ({root}); use a path inside it")
    return resolved
