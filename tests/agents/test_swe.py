"""SWE-format tasks from the offline suite (examples/swe_tiny): loading, the workspace the agent gets, grading with
the hidden tests, and Pi solving one end to end through the interception server with a scripted policy."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agents import LocalSandbox, PiAgent
from agents.graders import grade
from agents.runner import Runner, RunnerConfig
from agents.sandbox.namespace import namespaces_unavailable
from agents.specs.packages import PI
from agents.swe import load_swe_tasks
from agents.tasks import Limits, TaskError
from examples.swe_tiny.make_suite import make_suite
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("swe")
    return make_suite(out), out / "repos"


@pytest.fixture
def tasks(suite, tmp_path_factory):
    instances, repos = suite
    limits = Limits(wall_s=120, idle_s=60)
    cache = tmp_path_factory.mktemp("swe-cache")
    return {t.id: t for t in load_swe_tasks(instances, repos=repos, limits=limits, cache=cache)}


async def _workspace(task, tmp_path: Path) -> Path:
    """The workspace as the runner makes it, on the host (the runner runs the set-up inside the sandbox)."""
    workspace = tmp_path / "workspace"
    shutil.copytree(task.workspace, workspace)
    for command in task.setup:
        subprocess.run(command, shell=True, cwd=workspace, check=True, capture_output=True)
    return workspace


def _gold(suite, instance_id: str) -> str:
    instances, _ = suite
    return next(json.loads(line)["patch"] for line in instances.read_text().splitlines()
                if json.loads(line)["instance_id"] == instance_id)


async def test_the_workspace_is_the_base_commit_without_history_or_hidden_tests(tasks, tmp_path):
    task = tasks["tiny__calc-1"]
    workspace = await _workspace(task, tmp_path)
    assert (workspace / "calc.py").read_text().count("a - b") == 2  # the bug is there
    assert not (workspace / "tests" / "test_add.py").exists()  # the hidden test is not
    log = subprocess.run(["git", "log", "--oneline", "--all"], cwd=workspace, capture_output=True, text=True)
    assert len(log.stdout.splitlines()) == 1  # one commit: nothing of the repository's history
    assert "test_add" not in task.instruction


@pytest.mark.parametrize("instance_id", ["tiny__calc-1", "tiny__ranges-1", "tiny__text-1"])
async def test_the_gold_patch_earns_1_and_the_untouched_base_earns_0(suite, tasks, tmp_path, instance_id):
    task = tasks[instance_id]
    unsolved = await _workspace(task, tmp_path / "a")
    graded = await grade(task, answer=None, answered=False, workspace=unsolved)
    assert graded.reward == 0.0, graded.detail

    solved = await _workspace(task, tmp_path / "b")
    subprocess.run(["git", "apply", "-"], cwd=solved, input=_gold(suite, instance_id).encode(), check=True)
    graded = await grade(task, answer=None, answered=False, workspace=solved)
    assert graded.reward == 1.0, graded.detail


async def test_edits_to_the_hidden_tests_are_reverted_and_the_real_tests_decide(suite, tasks, tmp_path):
    task = tasks["tiny__calc-1"]
    workspace = await _workspace(task, tmp_path)
    # The agent writes its own test_add.py that always passes, and leaves the bug.
    (workspace / "tests" / "test_add.py").write_text("def test_add():\n    pass\n\n\ndef test_add_negative():\n    pass\n")
    graded = await grade(task, answer=None, answered=False, workspace=workspace)
    assert graded.reward == 0.0
    assert "reverted: ['tests/test_add.py']" in graded.detail


async def test_edits_to_a_test_the_patch_changes_are_reverted_even_when_the_fix_is_right(suite, tasks, tmp_path):
    task = tasks["tiny__ranges-1"]
    workspace = await _workspace(task, tmp_path)
    subprocess.run(["git", "apply", "-"], cwd=workspace, input=_gold(suite, "tiny__ranges-1").encode(), check=True)
    (workspace / "tests" / "test_ranges.py").write_text("# emptied by the agent\n")
    graded = await grade(task, answer=None, answered=False, workspace=workspace)
    assert graded.reward == 1.0, graded.detail
    assert "tests/test_ranges.py" in graded.detail


def test_an_instance_whose_repository_is_missing_is_a_clear_error(suite, tmp_path):
    instances, _ = suite
    with pytest.raises(TaskError, match="no git repository for tiny/calc"):
        load_swe_tasks(instances, repos=tmp_path, cache=tmp_path / "cache")


def test_test_lists_stored_as_json_text_are_read(suite, tmp_path):
    instances, repos = suite
    rows = [json.loads(line) for line in instances.read_text().splitlines()]
    for row in rows:
        row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"]), json.dumps(row["PASS_TO_PASS"])
    path = tmp_path / "as_text.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (task, *_) = load_swe_tasks(path, repos=repos, cache=tmp_path / "cache")
    assert task.grader.fail_to_pass == ("tests/test_add.py::test_add", "tests/test_add.py::test_add_negative")


@pytest.fixture
async def server(scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          max_model_len=MAX_MODEL_LEN, record_path=tmp_path / "rollouts.jsonl")
    async with InterceptionServer(config) as server:
        yield server


@pytest.mark.e2e
async def test_pi_fixes_the_bug_the_model_edits_and_earns_1(tasks, server, scripted):
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    scripted.script(bash_call("sed -i '2s/a - b/a + b/' calc.py && python3 -c 'import calc; print(calc.add(2, 3))'"),
                    "Fixed add.")
    runner = Runner(server, RunnerConfig(agent=pi, sandbox=LocalSandbox))
    (record,) = await runner.run_tasks([tasks["tiny__calc-1"]], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert_token_exact(record, scripted.calls)


@pytest.mark.e2e
async def test_pi_that_breaks_a_passing_test_earns_0(tasks, server, scripted):
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    scripted.script(bash_call("sed -i 's/a - b/a + b/' calc.py"), "Fixed add.")  # also breaks sub: P2P fails
    (record,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks([tasks["tiny__calc-1"]], n=1)
    assert record.status == "ok" and record.reward == 0.0, (record.failure, record.events)


@pytest.mark.e2e
async def test_pi_inside_the_namespace_sandbox_fixes_the_bug_through_the_bridge_and_earns_1(tasks, server, scripted):
    if reason := namespaces_unavailable():
        pytest.skip(reason)
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    scripted.script(bash_call("sed -i '2s/a - b/a + b/' calc.py && cat /proc/1/comm"), "Fixed add.")
    runner = Runner(server, RunnerConfig(agent=pi))  # the default sandbox: namespaces where the machine has them
    (record,) = await runner.run_tasks([tasks["tiny__calc-1"]], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert_token_exact(record, scripted.calls)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert tool_output.strip() == "bwrap"  # the tool ran in the sandbox's own PID namespace


@pytest.mark.e2e
async def test_opencode_inside_the_namespace_sandbox_fixes_the_bug_and_earns_1(tasks, server, scripted):
    from agents import OpenCodeAgent
    from agents.specs.packages import OPENCODE

    if reason := namespaces_unavailable():
        pytest.skip(reason)
    opencode = OpenCodeAgent(binary=require_agent(OPENCODE), context_window=MAX_MODEL_LEN, max_tokens=512)
    # OpenCode's title request races the first turn: both get the edit (the title generator ignores a tool call).
    # (No /proc look here: OpenCode's permission rules refuse commands that touch directories outside its own.)
    call = bash_call("sed -i '2s/a - b/a + b/' calc.py")
    scripted.script(call, call, "Fixed add.")
    (record,) = await Runner(server, RunnerConfig(agent=opencode)).run_tasks([tasks["tiny__calc-1"]], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events, record.trace)
    assert_token_exact(record, scripted.calls)
