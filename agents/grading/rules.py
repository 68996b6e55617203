"""Which of an agent's changes reach grading: the ones that change the code under test, not the way it is tested.

Refused by default, each with the kind its `tampering` event names:
- `test`: test files and directories (`test_*.py`, `*_test.py`, `tests/`, `test/`, `testing/`), `conftest.py`;
- `test_config`: `pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`, `noxfile.py`, `.coveragerc`;
- `startup_hook`: what the interpreter runs on its own: `*.pth`, `sitecustomize.py`, `usercustomize.py`, compiled
  `*.pyc` and `__pycache__/`;
- `packaging`: `setup.py`, `*.dist-info/`, `*.egg-info/`, `*.egg-link` (entry points, plugins);
- `git`: `.git/` and `.gitattributes`, `.gitmodules` (hooks, filters, configuration);
- `ci`: `.github/`, `.gitlab-ci.yml`, `.circleci/`;
- `shadowing`: a new top-level module or package named like one of the standard library's or the test runner's
  (`pytest`, `_pytest`, `pluggy`, `py`): imported in place of it;
- `link`: a link whose target is absolute or leaves the workspace, or is itself refused;
- `special`: a FIFO, socket or device.

A task's `grading.allow` patterns let some of these through (a task whose job is to write tests), and its
`grading.refuse` patterns add to them. Patterns are `fnmatch` globs matched against the path and each of its
trailing parts (`conftest.py` matches at any depth; `tests/*` and `tests/**` match everything under `tests/`).
"""

from __future__ import annotations

import fnmatch
import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agents.grading.changes import Change

__all__ = ["DEFAULT_RULES", "Refusal", "refusal"]

DEFAULT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test", ("test_*.py", "*_test.py", "tests", "tests/**", "test", "test/**", "testing", "testing/**",
              "conftest.py")),
    ("test_config", ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py", ".coveragerc")),
    ("startup_hook", ("*.pth", "sitecustomize.py", "usercustomize.py", "*.pyc", "__pycache__", "__pycache__/**")),
    ("packaging", ("setup.py", "*.dist-info", "*.dist-info/**", "*.egg-info", "*.egg-info/**", "*.egg-link")),
    ("git", (".git", ".git/**", ".gitattributes", ".gitmodules")),
    ("ci", (".github", ".github/**", ".gitlab-ci.yml", ".circleci", ".circleci/**")),
)  # fmt: skip
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "conftest"})


@dataclass(frozen=True, slots=True)
class Refusal:
    path: str
    kind: str  # the rule's name: test, test_config, startup_hook, packaging, git, ci, shadowing, link, special
    what: str  # added, modified, deleted


def refusal(change: Change, *, allow: Sequence[str] = (), refuse: Sequence[str] = ()) -> Refusal | None:
    """Why this change does not reach grading, or None when it does."""
    path = change.path
    if _matches(path, allow):
        return None
    kind = _kind(change, refuse)
    return None if kind is None else Refusal(path=path, kind=kind, what=change.what)


def _kind(change: Change, refuse: Sequence[str]) -> str | None:
    path, entry = change.path, change.entry
    for kind, patterns in DEFAULT_RULES:
        if _matches(path, patterns):
            return kind
    if _matches(path, refuse):
        return "task_rule"
    if entry is not None and entry.kind == "special":
        return "special"
    if entry is not None and entry.kind == "link" and _link_refused(path, entry.digest):
        return "link"
    if change.what == "added" and _shadows(change):
        return "shadowing"
    return None


def _matches(path: str, patterns: Sequence[str]) -> bool:
    parts = path.split("/")
    candidates = ["/".join(parts[i:]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.endswith("/**"):
            prefix = pattern[:-3]
            if any(fnmatch.fnmatchcase(part, prefix) for part in parts[:-1]):
                return True
        elif any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates):
            return True
    return False


def _link_refused(path: str, target: str) -> bool:
    if posixpath.isabs(target):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        return True
    return any(_matches(resolved, patterns) for _, patterns in DEFAULT_RULES)


def _shadows(change: Change) -> bool:
    """A new top-level `name.py`, or anything in a new top-level `name/` (a package, or a namespace one), named like a
    module the test run imports."""
    top, _, rest = change.path.partition("/")
    if rest or (change.entry is not None and change.entry.kind == "dir"):
        name = top
    elif top.endswith(".py"):
        name = top[:-3]
    else:
        return False  # a top-level file that is not a module
    return name in sys.stdlib_module_names or name in _RUNNER_MODULES
