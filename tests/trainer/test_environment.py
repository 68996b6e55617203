"""trainer.rl.environment: the tools of a TRL environment run in a real sandbox, refuse malformed calls with a tool
error, bound their output, end the episode on an answer or a turn limit, and release every sandbox."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import pytest

from agents.sandbox.base import LocalSandbox, LocalSandboxConfig
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable
from agents.tasks import load_tasks
from trainer.rl.environment import EnvironmentConfig, TaskEnvironment, grader_reward, task_dataset
from trainer.rl.environment_host import SandboxHost

TASKS = [
    {"id": "add", "instruction": "Submit the answer 5 by running: answer 5", "grader": {"kind": "answer", "expected": "5", "match": "numeric"}},
    {"id": "file", "instruction": "Create done.txt", "grader": {"kind": "command", "command": "test -f done.txt"}},
    {"id": "broken-setup", "instruction": "x", "setup": ["exit 3"], "grader": {"kind": "answer", "expected": "1"}},
    {"id": "crashing-grader", "instruction": "x", "grader": {"kind": "python", "callable": "tests.trainer.test_environment:crashing_grader"}},
]


def crashing_grader(task, answer, workspace):
    raise RuntimeError("the grader's own bug")


def _live_processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


@pytest.fixture
def boxes(tmp_path) -> Path:
    return tmp_path / "boxes"


@pytest.fixture
def host(boxes):
    config = LocalSandboxConfig(parent_dir=boxes)
    make = (lambda: NamespaceSandbox(config)) if namespaces_unavailable() is None else (lambda: LocalSandbox(config))
    boxes.mkdir()
    opened = SandboxHost(sandbox=make)
    yield opened
    opened.close()
    assert list(boxes.iterdir()) == []
    assert _live_processes_mentioning(str(boxes)) == []


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    return load_tasks(path)


@pytest.fixture
def env(tasks, host):
    environment = TaskEnvironment(tasks, config=EnvironmentConfig(max_turns=4, max_output_chars=500, max_write_chars=1000), host=host)
    environment.reset(task_id="add")
    return environment


@pytest.mark.parametrize("call", [
    lambda e: e.bash(command=5),
    lambda e: e.bash(),
    lambda e: e.bash(command="true", extra="x"),
    lambda e: e.bash(command="   "),
    lambda e: e.read_file(path=["a"]),
    lambda e: e.read_file(path="missing.txt"),
    lambda e: e.write_file(path="a.txt"),
    lambda e: e.write_file(path="a.txt", content=None),
    lambda e: e.answer(value=5),
    lambda e: e.answer(),
], ids=["bash-int", "bash-missing", "bash-extra", "bash-empty", "read-list", "read-missing", "write-missing",
        "write-null", "answer-int", "answer-missing"])
def test_malformed_calls_come_back_as_tool_errors_and_end_nothing(env, call):
    result = call(env)
    assert result.startswith("error: ")
    assert env.state.ended is None and not env.state.answered


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt", "link/passwd"])
def test_paths_outside_the_workspace_are_refused(env, path):
    env.bash(command="ln -s /etc link")
    assert "outside the workspace" in env.read_file(path=path)
    assert "outside the workspace" in env.write_file(path=path, content="x")


def test_over_long_content_is_refused_and_nothing_is_written(env):
    assert "at most 1000" in env.write_file(path="big.txt", content="x" * 1001)
    assert "does not exist" in env.read_file(path="big.txt")


def test_output_is_bounded_with_a_note_of_how_much_was_cut(env):
    result = env.bash(command="head -c 20000 /dev/zero | tr '\\0' a")
    assert "characters cut" in result and len(result) < 700
    env.write_file(path="f.txt", content="b" * 1000)
    read = env.read_file(path="f.txt")
    assert read.startswith("b" * 500 + "\n") and read.endswith("[... cut: 500 more bytes of 1000]")


def test_tools_run_inside_the_sandbox_workspace(env):
    assert env.write_file(path="d/note.txt", content="hello") == "wrote 5 characters to d/note.txt"
    assert "hello" in env.bash(command="cat d/note.txt")
    env.bash(command="echo made > made.txt")
    assert env.read_file(path="made.txt").startswith("made\n")
    assert env.state.calls == ("write_file", "bash", "bash", "read_file")


def test_answer_ends_the_episode_and_later_calls_do_not_run(env):
    assert "episode is over" in env.answer(value="5")
    assert "episode has ended" in env.bash(command="touch late.txt")
    assert env.state.calls == ("answer",) and env.state.answer == "5"
    assert grader_reward([env]) == [1.0]


def test_the_answer_command_in_the_sandbox_ends_the_episode(env):
    assert "episode is over" in env.bash(command="answer 7")
    assert "episode has ended" in env.answer(value="5")
    assert grader_reward([env]) == [0.0]


def test_turn_limit_ends_the_episode(env):
    results = [env.bash(command="true") for _ in range(5)]
    assert "limit of 4 tool calls" in results[3] and "episode has ended" in results[4]
    assert grader_reward([env]) == [0.0]  # no answer: a zero, not an infrastructure failure


def test_a_command_grader_runs_in_the_workspace(env):
    env.reset(task_id="file")
    assert grader_reward([env]) == [0.0]
    env.reset(task_id="file")
    env.write_file(path="done.txt", content="")
    assert grader_reward([env]) == [1.0]


def test_infrastructure_failures_are_none_never_zero(tasks, host):
    env = TaskEnvironment(tasks, host=host)
    env.reset(task_id="broken-setup")
    assert env.state.failure and "setup command failed" in env.state.failure
    assert env.bash(command="true").startswith("error: ")
    env2 = TaskEnvironment(tasks, host=host)
    env2.reset(task_id="crashing-grader")
    assert grader_reward([env, env2, TaskEnvironment(tasks, host=host)]) == [None, None, None]
    unavailable = SandboxHost(sandbox=lambda: NamespaceSandbox(bwrap="no-such-bwrap"))
    try:
        env3 = TaskEnvironment(tasks, host=unavailable)
        env3.reset(task_id="add")
        assert "could not be made" in env3.state.failure
        assert grader_reward([env3]) == [None]
    finally:
        unavailable.close()


def test_reset_releases_the_previous_sandbox_and_exit_releases_the_last(tasks, host, boxes):
    with TaskEnvironment(tasks, host=host) as env:
        for task_id in ("add", "file", "add"):
            env.reset(task_id=task_id)
            assert host.open_sandboxes == 1
    assert host.open_sandboxes == 0


def test_a_dropped_environment_releases_its_sandbox(tasks, host):
    env = TaskEnvironment(tasks, host=host)
    env.reset(task_id="add")
    del env
    gc.collect()
    deadline = time.monotonic() + 30
    while host.open_sandboxes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host.open_sandboxes == 0


def test_reset_returns_the_instruction_only_when_the_prompt_lacks_it(tasks, host):
    env = TaskEnvironment(tasks, host=host)
    row = task_dataset(tasks)[0]
    assert row["task_id"] == "add" and row["prompt"] == [{"role": "user", "content": TASKS[0]["instruction"]}]
    assert env.reset(**row) is None
    assert env.reset(task_id="add", prompt=[{"role": "user", "content": "Solve this."}]) == TASKS[0]["instruction"]
    with pytest.raises(KeyError):
        env.reset(task_id="no-such-task")
    with env:
        pass


def test_tools_render_as_typed_documented_schemas(tasks):
    from transformers.utils import get_json_schema

    env = TaskEnvironment(tasks)
    schema = get_json_schema(env.write_file)["function"]
    assert schema["name"] == "write_file" and schema["parameters"]["required"] == ["path", "content"]
    assert schema["parameters"]["properties"]["content"]["type"] == "string"
    assert get_json_schema(env.bash)["function"]["parameters"]["properties"]["command"]["description"]


TESTED = {"id": "tested", "instruction": "Make tests pass", "files": {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
    "grader": {"kind": "command", "command": f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py"}}
CONFTEST = "import calc\n\ncalc.add = lambda a, b: a + b\n"  # the bug "fixed" for the tests only


@pytest.mark.parametrize(("where", "reward"), [("fresh", 0.0), ("in_place", 1.0)])
def test_a_conftest_that_patches_the_code_under_test_earns_nothing_when_graded_fresh(tmp_path, host, where, reward):
    """The episode's changes are graded in a fresh box with the ones that change how it is tested refused; the
    old in-place grading, kept as a task's explicit choice, is fooled by the same trick."""
    path = tmp_path / "tested.jsonl"
    path.write_text(json.dumps({**TESTED, "grading": {"where": where}}) + "\n")
    env = TaskEnvironment(load_tasks(path), host=host)
    env.reset(task_id="tested")
    env.write_file(path="conftest.py", content=CONFTEST)
    assert grader_reward([env]) == [reward]
    if where == "fresh":
        assert env.state.tampering["counts"] == {"test": 1}
        assert host.open_sandboxes == 0  # the episode's box was closed before grading
    else:
        assert env.state.tampering is None
    env.reset(task_id="tested")
    env.write_file(path="calc.py", content="def add(a, b):\n    return a + b\n")
    assert grader_reward([env]) == [1.0]  # the honest fix earns 1 either way
