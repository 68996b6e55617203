"""Task files, host graders and the `answer` command: rewards are computed on the host from what the agent
submitted or left in its workspace; a grader that cannot decide is a failure, never a zero."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from agents.answer_command import write_answer_command
from agents.graders import GRADERS, GraderFailed, grade
from agents.tasks import GRADER_KINDS, Task, TaskError, load_tasks
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig


def task(grader: dict, **extra) -> Task:
    return Task.from_dict({"id": "t", "instruction": "do it", "grader": grader, **extra}, base_dir=".")


@pytest.mark.parametrize(
    ("grader", "answer", "reward"),
    [
        ({"kind": "answer", "expected": "5", "match": "exact"}, " 5 ", 1.0),
        ({"kind": "answer", "expected": "5", "match": "exact"}, "5.0", 0.0),
        ({"kind": "answer", "expected": 5, "match": "numeric"}, "5.0", 1.0),
        ({"kind": "answer", "expected": "5", "match": "numeric"}, "five", 0.0),
        ({"kind": "answer", "expected": r"4\d", "match": "regex"}, "42", 1.0),
        ({"kind": "answer", "expected": r"4\d", "match": "regex"}, "420", 0.0),
    ],
)
async def test_answer_grader_matches(tmp_path, grader, answer, reward):
    result = await grade(task(grader), answer=answer, answered=True, workspace=tmp_path)
    assert result.reward == reward


async def test_no_submission_is_reward_zero_not_a_failure(tmp_path):
    result = await grade(task({"kind": "answer", "expected": "5"}), answer=None, answered=False, workspace=tmp_path)
    assert result.reward == 0.0 and "no answer" in result.detail


async def test_command_grader_uses_exit_status(tmp_path):
    (tmp_path / "done.txt").write_text("yes")
    ok = await grade(task({"kind": "command", "command": "test -f done.txt"}), answer=None, answered=False, workspace=tmp_path)
    bad = await grade(task({"kind": "command", "command": "test -f nope.txt"}), answer=None, answered=False, workspace=tmp_path)
    assert (ok.reward, bad.reward) == (1.0, 0.0)


async def test_command_grader_with_fail_to_pass_and_pass_to_pass(tmp_path):
    (tmp_path / "test_code.py").write_text(
        "def test_fixed():\n    assert 1 + 1 == 2\n\ndef test_still_ok():\n    pass\n\ndef test_broken():\n    assert False\n"
    )
    command = f"{sys.executable} -m pytest -q -rA -p no:cacheprovider"
    passing = task({"kind": "command", "command": command, "fail_to_pass": ["test_code.py::test_fixed"],
                    "pass_to_pass": ["test_code.py::test_still_ok"]})
    failing = task({"kind": "command", "command": command, "fail_to_pass": ["test_code.py::test_broken"],
                    "pass_to_pass": ["test_code.py::test_still_ok"]})
    assert (await grade(passing, answer=None, answered=False, workspace=tmp_path)).reward == 1.0
    result = await grade(failing, answer=None, answered=False, workspace=tmp_path)
    assert result.reward == 0.0 and "1/2" in result.detail


def test_every_grader_kind_has_its_grader_and_nothing_else_does():
    assert set(GRADERS) == set(GRADER_KINDS)
    with pytest.raises(TaskError, match="unknown grader kind 'vibes': one of answer, command, python, swe"):
        task({"kind": "vibes"})


async def test_a_grader_of_a_kind_with_no_grader_is_a_failure_not_a_crash(tmp_path):
    odd = task({"kind": "answer", "expected": "5"})
    object.__setattr__(odd.grader, "kind", "vibes")  # built around the check, as a caller's own Grader could be
    with pytest.raises(GraderFailed, match="no grader of kind 'vibes'"):
        await grade(odd, answer="5", answered=True, workspace=tmp_path)


async def test_grader_that_times_out_or_raises_is_a_failure(tmp_path):
    slow = task({"kind": "command", "command": "sleep 5", "timeout_s": 0.2})
    with pytest.raises(GraderFailed, match="timed out"):
        await grade(slow, answer=None, answered=False, workspace=tmp_path)
    broken = task({"kind": "python", "callable": "json:loads"})  # wrong signature: raises TypeError
    with pytest.raises(GraderFailed, match="json:loads"):
        await grade(broken, answer="1", answered=True, workspace=tmp_path)


def test_task_file_errors_name_the_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "instruction": "x", "grader": {"kind": "answer", "expected": "1"}}\n{"id": "b"}\n')
    with pytest.raises(TaskError, match=r"tasks.jsonl:2"):
        load_tasks(path)
    path.write_text('{"id": "a", "instruction": "x", "grader": {"kind": "answer", "expected": "1"}, "files": {"../x": ""}}\n')
    with pytest.raises(TaskError, match="inside the workspace"):
        load_tasks(path)


def test_example_task_set_loads():
    tasks = load_tasks("examples/tasks/arithmetic.jsonl")
    assert len(tasks) >= 3 and {t.grader.kind for t in tasks} == {"answer", "command"}


async def test_answer_command_submits_with_the_tools_secret(scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout()
        command = write_answer_command(tmp_path / "bin", base_url=handle.base_url, tools_secret=handle.tools_secret)
        assert handle.secret not in command.read_text()
        result = await asyncio.to_thread(subprocess.run, [str(command), "4", "2"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert "recorded" in result.stdout and "reward" not in result.stdout.lower()
        record = await server.finish_rollout(handle.id)
    assert record.answer == "4 2"
