"""`interceptor run` refuses sandbox options it cannot honour, with a message and before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t", "instruction": "say hi", "grader": {"kind": "answer", "expected": "hi"}}\n')
    return subprocess.run([sys.executable, "-m", "interceptor.cli", "run", "--tasks", str(tasks), "--out",
                           str(tmp_path / "out"), "--upstream", "http://127.0.0.1:9", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sandbox", "local", "--memory-mib", "512"), "need an isolating sandbox"),
        (("--pids", "0"), "pids must be positive"),
        (("--warm-pool", "-1"), "--warm-pool must be 0 or more"),
    ],
)
def test_a_limit_or_pool_size_that_cannot_be_honoured_is_refused_with_a_message(tmp_path, args, message):
    done = run_cli(*args, tmp_path=tmp_path)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()
