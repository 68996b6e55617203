"""Build a small offline SWE-format suite: tiny Python repositories, each with a real bug, tests that pass today
(PASS_TO_PASS), a hidden test patch whose tests fail until the bug is fixed (FAIL_TO_PASS), and the gold patch.

    python examples/swe_tiny/make_suite.py OUT        # OUT/repos/<owner>__<name>/ (git), OUT/instances.jsonl

Nothing is downloaded: the repositories are written here and committed with git. `instances.jsonl` is in the
SWE-Gym / SWE-bench instance format (`instance_id`, `repo`, `base_commit`, `problem_statement`, `test_patch`,
`FAIL_TO_PASS`, `PASS_TO_PASS`, and the gold `patch`, which graders never need and agents never see), for
`agents.swe.load_swe_tasks(OUT / "instances.jsonl", repos=OUT / "repos")`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUITE", "make_suite"]


@dataclass(frozen=True)
class _Repo:
    repo: str  # owner/name
    problem: str
    files: dict[str, str]  # the buggy base
    fixed: dict[str, str]  # what the gold patch changes
    hidden_tests: dict[str, str]  # what the test patch adds or changes
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]


SUITE = (
    _Repo(
        repo="tiny/calc",
        problem="`calc.add(a, b)` returns the difference of its arguments instead of their sum.",
        files={
            "calc.py": "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
            "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n",
        },
        fixed={"calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"},
        hidden_tests={
            "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
            "def test_add_negative():\n    assert add(-2, -3) == -5\n",
        },
        fail_to_pass=("tests/test_add.py::test_add", "tests/test_add.py::test_add_negative"),
        pass_to_pass=("tests/test_sub.py::test_sub",),
    ),
    _Repo(
        repo="tiny/ranges",
        problem="`ranges.inclusive(a, b)` should include `b`, but it stops one short: inclusive(1, 3) is [1, 2].",
        files={
            "ranges.py": "def inclusive(a, b):\n    return list(range(a, b))\n\n\n"
            "def exclusive(a, b):\n    return list(range(a, b))\n",
            "tests/test_ranges.py": "from ranges import exclusive\n\n\ndef test_exclusive():\n"
            "    assert exclusive(1, 3) == [1, 2]\n",
        },
        fixed={"ranges.py": "def inclusive(a, b):\n    return list(range(a, b + 1))\n\n\n"
               "def exclusive(a, b):\n    return list(range(a, b))\n"},
        hidden_tests={
            "tests/test_ranges.py": "from ranges import exclusive, inclusive\n\n\ndef test_exclusive():\n"
            "    assert exclusive(1, 3) == [1, 2]\n\n\ndef test_inclusive():\n    assert inclusive(1, 3) == [1, 2, 3]\n",
        },
        fail_to_pass=("tests/test_ranges.py::test_inclusive",),
        pass_to_pass=("tests/test_ranges.py::test_exclusive",),
    ),
    _Repo(
        repo="tiny/text",
        problem="`text.title_words(s)` should capitalise every word, but only the first one is capitalised.",
        files={
            "text.py": "def title_words(s):\n    return s.capitalize()\n\n\ndef shout(s):\n    return s.upper()\n",
            "tests/test_text.py": "from text import shout\n\n\ndef test_shout():\n    assert shout('hi') == 'HI'\n",
        },
        fixed={"text.py": "def title_words(s):\n    return ' '.join(w.capitalize() for w in s.split(' '))\n\n\n"
               "def shout(s):\n    return s.upper()\n"},
        hidden_tests={
            "tests/test_title.py": "from text import title_words\n\n\ndef test_title_words():\n"
            "    assert title_words('hello big world') == 'Hello Big World'\n",
        },
        fail_to_pass=("tests/test_title.py::test_title_words",),
        pass_to_pass=("tests/test_text.py::test_shout",),
    ),
)

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "suite", "GIT_AUTHOR_EMAIL": "suite@example.invalid",
    "GIT_COMMITTER_NAME": "suite", "GIT_COMMITTER_EMAIL": "suite@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _diff_of(repo: Path, files: dict[str, str]) -> str:
    """The patch that turns the base into the base with `files` written, as `git diff` prints it."""
    _write(repo, files)
    _git(repo, "add", "-A")
    patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    _git(repo, "clean", "-qfd")
    return patch


def make_suite(out: Path) -> Path:
    """Write the repositories and `instances.jsonl` under `out`; returns the instances file."""
    out = Path(out)
    lines = []
    for spec in SUITE:
        repo = out / "repos" / spec.repo.replace("/", "__")
        repo.mkdir(parents=True, exist_ok=True)
        if not (repo / ".git").is_dir():
            _git(repo, "init", "-q", "-b", "main")
            _write(repo, spec.files)
            _git(repo, "add", "-A")
            _git(repo, "commit", "-q", "-m", "base")
        base = _git(repo, "rev-parse", "HEAD").strip()
        lines.append(json.dumps({
            "instance_id": spec.repo.replace("/", "__") + "-1",
            "repo": spec.repo,
            "base_commit": base,
            "problem_statement": spec.problem,
            "test_patch": _diff_of(repo, spec.hidden_tests),
            "patch": _diff_of(repo, spec.fixed),
            "FAIL_TO_PASS": list(spec.fail_to_pass),
            "PASS_TO_PASS": list(spec.pass_to_pass),
        }))
    instances = out / "instances.jsonl"
    instances.write_text("\n".join(lines) + "\n")
    return instances


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_suite.py OUT")
    print(make_suite(Path(sys.argv[1])))
