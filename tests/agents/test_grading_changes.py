"""What an agent changed, as data, and which changes reach grading: manifests of real directories, changes carried
from one tree and applied onto a clean copy of another, and the refusal rules on the paths agents write."""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

import pytest

from agents.grading.changes import Change, Entry, apply, carry, changes, manifest
from agents.grading.rules import refusal
from agents.tasks import Grading, Task, TaskError


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_changes_carried_from_the_agents_tree_make_a_clean_copy_equal_to_it(tmp_path):
    base = {"calc.py": "a - b\n", "lib/util.py": "x = 1\n", "old.txt": "gone soon\n", "lib/keep.py": "k\n"}
    agent = tree(tmp_path / "agent", base)
    before = manifest(agent)
    (agent / "calc.py").write_text("a + b\n")
    (agent / "old.txt").unlink()
    (agent / "lib" / "util.py").unlink()
    (agent / "lib" / "util.py").mkdir()  # a file replaced by a directory
    (agent / "lib" / "util.py" / "inner.py").write_text("y = 2\n")
    (agent / "run.sh").write_text("#!/bin/sh\n")
    (agent / "run.sh").chmod(0o755)
    (agent / "link").symlink_to("calc.py")
    changed = changes(before, manifest(agent))
    assert {(c.path, c.what) for c in changed} == {
        ("calc.py", "modified"), ("old.txt", "deleted"), ("lib/util.py", "modified"),
        ("lib/util.py/inner.py", "added"), ("run.sh", "added"), ("link", "added")}  # fmt: skip
    carried = carry(changed, agent)
    clean = tree(tmp_path / "clean", base)
    apply(carried, clean)
    assert manifest(clean) == manifest(agent)
    assert os.readlink(clean / "link") == "calc.py"


def test_nothing_is_written_through_a_link_when_changes_are_applied(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "out").symlink_to(outside)  # a link already in the clean tree
    change = Change("out", "modified", Entry("file", 0o644, "x"), Entry("link", 0o777, str(outside)))
    from agents.grading.changes import Carried

    apply([Carried(change, b"overwritten\n")], clean)
    assert outside.read_text() == "untouched\n"
    assert (clean / "out").read_bytes() == b"overwritten\n" and not (clean / "out").is_symlink()


@pytest.mark.parametrize(("path", "kind"), [
    ("conftest.py", "test"), ("pkg/conftest.py", "test"), ("tests/test_calc.py", "test"), ("test_x.py", "test"),
    ("src/tests/data.json", "test"), ("pytest.ini", "test_config"), ("pyproject.toml", "test_config"),
    ("setup.cfg", "test_config"), ("evil.pth", "startup_hook"), ("sitecustomize.py", "startup_hook"),
    ("pkg/__pycache__/m.cpython-311.pyc", "startup_hook"), ("forge-1.0.dist-info/entry_points.txt", "packaging"),
    ("setup.py", "packaging"), (".git/hooks/pre-commit", "git"), (".github/workflows/ci.yml", "ci"),
    ("shlex.py", "shadowing"), ("pytest/__main__.py", "shadowing"), ("json/__init__.py", "shadowing"),
])  # fmt: skip
def test_changes_to_how_the_code_is_tested_are_refused_with_their_kind(path, kind):
    refused = refusal(Change(path, "added", Entry("file", 0o644, "d")))
    assert refused is not None and refused.kind == kind


@pytest.mark.parametrize("path", ["calc.py", "pkg/module.py", "README.md", "src/calc/ops.py", "data/input.csv"])
def test_changes_to_the_code_under_test_reach_grading(path):
    assert refusal(Change(path, "added", Entry("file", 0o644, "d"))) is None


@pytest.mark.parametrize(("target", "refused"), [("calc.py", False), ("../../etc/passwd", True), ("/etc/passwd", True),
                                                 ("tests/test_calc.py", True), ("sub/../calc.py", False)])
def test_a_link_out_of_the_workspace_or_to_a_refused_path_is_refused(target, refused):
    result = refusal(Change("pkg/link.py", "added", Entry("link", 0o777, target)))
    assert (result is not None and result.kind in ("link",)) == refused


def test_a_tasks_allow_and_refuse_globs_move_the_line():
    change = Change("tests/test_new.py", "added", Entry("file", 0o644, "d"))
    assert refusal(change, allow=("tests/**",)) is None
    assert refusal(Change("docs/x.md", "added", Entry("file", 0o644, "d")), refuse=("docs/**",)).kind == "task_rule"


def test_a_fifo_is_refused_as_special(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (change,) = changes({}, manifest(tmp_path))
    assert refusal(change).kind == "special"


def test_a_checked_pyc_is_what_running_code_makes_and_an_unchecked_one_is_not(tmp_path):
    from agents.grading.fresh import _generated

    (tmp_path / "m.py").write_text("x = 1\n")
    modes = {"stamp": py_compile.PycInvalidationMode.TIMESTAMP, "checked": py_compile.PycInvalidationMode.CHECKED_HASH,
             "unchecked": py_compile.PycInvalidationMode.UNCHECKED_HASH}
    for name, mode in modes.items():
        py_compile.compile(str(tmp_path / "m.py"), cfile=str(tmp_path / f"{name}.pyc"), invalidation_mode=mode)
    entries = manifest(tmp_path)
    made = {name: _generated(Change(f"{name}.pyc", "added", entries[f"{name}.pyc"]), tmp_path) for name in modes}
    assert made == {"stamp": True, "checked": True, "unchecked": False}


def test_a_task_file_grading_section_is_read_and_checked(tmp_path):
    task = Task.from_dict({"id": "t", "instruction": "i", "grader": {"kind": "command", "command": "true"},
                           "grading": {"where": "in_place", "allow": ["tests/**"], "tampering": "zero"}},
                          base_dir=tmp_path)  # fmt: skip
    assert task.grading == Grading(where="in_place", allow=("tests/**",), tampering="zero")
    for bad in ({"where": "elsewhere"}, {"tampering": "half"}, {"allow": "tests/**"}, {"unknown": 1},
                {"max_change_bytes": 0}):
        with pytest.raises(TaskError):
            Task.from_dict({"id": "t", "instruction": "i", "grader": {"kind": "command", "command": "true"},
                            "grading": bad}, base_dir=tmp_path)  # fmt: skip
