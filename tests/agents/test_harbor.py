"""Harbor tasks as a task source (`agents.harbor`): the two example tasks in `examples/harbor` read as tasks, their
images built from their Dockerfiles, Pi driven by a scripted policy working in the image's WORKDIR, and the
reward taken from Harbor's verifier (`tests/test.sh` writing /logs/verifier/reward.*) run in a fresh box of the
task; what the loader cannot honour is refused with the reason; the verifier's files never reach the agent."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from agents import CommandAgent, PiAgent
from agents.errors import AgentConfigError
from agents.harbor import is_harbor_dataset, load_harbor_tasks
from agents.runner import Runner, RunnerConfig
from agents.sandbox.backends import BoxChooser, Placement
from agents.sources import load_tasks
from agents.specs.packages import PI
from agents.specs.spec import Bind
from agents.tasks import TaskError
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_docker_sandbox import WHY_NOT
from .test_swe import server  # noqa: F401  (fixture: a server on port 0 in front of the scripted upstream)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
docker = pytest.mark.skipif(WHY_NOT is not None, reason=f"docker sandbox: {WHY_NOT}")


@pytest.fixture(scope="module")
def harbor_tasks():
    if WHY_NOT is not None:
        pytest.skip(f"docker sandbox: {WHY_NOT}")
    return {task.id: task for task in load_tasks(EXAMPLES)}


def _copy_task(tmp_path: Path, name: str = "fix-calc") -> Path:
    copied = tmp_path / name
    shutil.copytree(EXAMPLES / name, copied)
    return copied


# ------------------------------------------------------------------------------------------- reading


@docker
def test_the_example_dataset_reads_as_tasks_with_their_images_workdirs_and_verifiers(harbor_tasks):
    assert is_harbor_dataset(EXAMPLES) and is_harbor_dataset(EXAMPLES / "fix-calc")
    fix, greet = harbor_tasks["interceptor/fix-calc"], harbor_tasks["interceptor/write-greeting"]
    assert fix.image.startswith("interceptor/harbor-interceptor-fix-calc:") and fix.workdir == "/app"
    assert (fix.network, fix.egress, fix.limits.wall_s) == ("model", (), 300.0)
    assert fix.grader.kind == "harbor" and fix.grader.tests == EXAMPLES / "fix-calc" / "tests"
    assert fix.grader.timeout_s == 120.0 and fix.instruction.startswith("`add` in /app/calc.py")
    assert greet.grader.env == (("EXPECTED", "hello, harbor"),)
    # built once: the same content is the same tag, and loading again builds nothing
    assert load_harbor_tasks(EXAMPLES / "fix-calc")[0].image == fix.image


@docker
def test_a_changed_environment_is_a_new_image(tmp_path, harbor_tasks):
    copied = _copy_task(tmp_path)
    (copied / "environment" / "calc.py").write_text("def add(a, b):\n    return a * b\n")
    (task,) = load_harbor_tasks(copied)
    assert task.image != harbor_tasks["interceptor/fix-calc"].image


@pytest.mark.parametrize(("table", "message"), [
    ("[[steps]]\nname = 'one'\n", "multi-step tasks"),
    ("[environment]\nos = 'windows'\n", "only Linux environments"),
    ("[environment]\ngpus = 1\n", "GPU and TPU"),
    ("[environment]\nenv = { TOKEN = 'x' }\n", "[environment].env is not passed"),
    ("[verifier]\nuser = 'root'\n", "the verifier runs as this host's user here, not as 'root'"),
    ("[agent]\nnetwork_mode = 'public'\n", "a network policy for the agent alone"),
    ("[verifier]\nenvironment_mode = 'separate'\n", "a separate verifier environment"),
    ("[environment]\nmcp_servers = [{ name = 'm', url = 'http://x' }]\n", "MCP servers"),
    ("[oracle]\nx = 1\n", "unknown tables or keys ['oracle']"),
])
def test_what_cannot_be_honoured_is_refused_before_anything_is_built(tmp_path, table, message):
    copied = _copy_task(tmp_path)
    config = copied / "task.toml"
    text = config.read_text()
    section = table.split("]", 1)[0] + "]"
    if section in text and not table.startswith("[["):  # merge into the existing table
        text = text.replace(section, table.rstrip("\n"), 1)
    else:
        text += "\n" + table
    config.write_text(text)
    with pytest.raises(TaskError, match=re.escape(message)):
        load_harbor_tasks(copied, docker="no-such-docker")


def test_a_task_without_a_verifier_or_a_dockerfile_is_refused(tmp_path):
    copied = _copy_task(tmp_path)
    (copied / "tests" / "test.sh").unlink()
    (copied / "environment" / "Dockerfile").unlink()
    with pytest.raises(TaskError, match="no Dockerfile.*no tests/test.sh"):
        load_harbor_tasks(copied, docker="no-such-docker")
    with pytest.raises(TaskError, match="not a Harbor task or dataset"):
        load_tasks(tmp_path / "fix-calc" / "environment")


def test_network_modes_map_to_the_model_network_an_egress_list_or_the_open_one(tmp_path):
    from agents.harbor.tasks import _network

    assert _network({}) == ("model", ()) and _network({"network_mode": "no-network"}) == ("model", ())
    assert _network({"network_mode": "public"}) == ("open", ())
    assert _network({"network_mode": "allowlist", "allowed_hosts": ["pypi.org", "*.pythonhosted.org", "::1"]}) == (
        "model", ("pypi.org", "*.pythonhosted.org", "[::1]"))
    with pytest.raises(TaskError, match="CIDR"):
        _network({"network_mode": "allowlist", "allowed_hosts": ["10.0.0.0/8"]})


def test_a_task_with_a_workdir_is_refused_where_it_cannot_run_in_its_image():
    with pytest.raises(AgentConfigError, match="runs in its image with a local Docker daemon, not in local"):
        BoxChooser("local", Placement())("img:1", "model", (), "/app")


# ------------------------------------------------------------------------------------------ rollouts


@docker
@pytest.mark.e2e
async def test_pi_fixes_the_bug_in_the_images_workdir_and_harbors_verifier_gives_the_reward(
    harbor_tasks, server, scripted  # noqa: F811
):
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    task = harbor_tasks["interceptor/fix-calc"]
    scripted.script(bash_call("pwd; ls /tests /logs 2>&1; sed -i 's/return a - b/return a + b/' calc.py"),
                    "Fixed add.")  # fmt: skip
    async with asyncio.timeout(240):
        (record,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks([task], n=1)
    assert (record.status, record.reward) == ("ok", 1.0), (record.failure, record.events)
    tool_output = next(m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool")
    assert tool_output.startswith("/app\n"), tool_output  # the agent works where the task says
    assert "No such file or directory" in tool_output  # the verifier's files are not in the agent's box
    graded = next(event for event in record.events if event["kind"] == "graded")
    assert "from reward.txt" in graded["detail"]
    assert_token_exact(record, scripted.calls)


@docker
async def test_the_reward_is_the_verifiers_for_honest_idle_and_cheating_agents(harbor_tasks, server):  # noqa: F811
    """The greeting task's reward.json; an agent that does nothing earns 0; one that writes the reward file where
    the verifier will read it cannot (there is no /logs/verifier in its box, and grading is in a fresh one)."""
    task = harbor_tasks["interceptor/write-greeting"]
    agents = {
        "honest": ("sh", "-c", "echo 'hello, harbor' > out/greeting.txt"),
        "idle": ("true",),
        "forger": ("sh", "-c", "mkdir -p logs/verifier; echo 1 > logs/verifier/reward.txt; "
                               "echo '{\"reward\": 1}' > /logs/verifier/reward.json 2>/dev/null; true"),
    }
    rewards = {}
    for name, argv in agents.items():
        (record,) = await Runner(server, RunnerConfig(agent=CommandAgent(argv=argv))).run_tasks([task], n=1)
        assert record.status == "ok", (name, record.failure)
        rewards[name] = record.reward
    assert rewards == {"honest": 1.0, "idle": 0.0, "forger": 0.0}


@docker
async def test_a_verifier_that_leaves_no_reward_is_a_grader_failure_not_a_zero(tmp_path, server):  # noqa: F811
    copied = _copy_task(tmp_path)
    (copied / "tests" / "test.sh").write_text("#!/bin/bash\necho 'forgot the reward'\n")
    (task,) = load_harbor_tasks(copied)
    (record,) = await Runner(server, RunnerConfig(agent=CommandAgent(argv=("true",)))).run_tasks([task], n=1)
    assert record.status == "failed" and record.failure.cause == "grader", record.failure
    assert "no reward.json or reward.txt" in record.failure.message


@docker
async def test_binds_show_host_paths_at_box_paths_read_only_unless_writable(harbor_tasks, tmp_path):
    from agents.sandbox.docker import DockerSandbox

    shown, logs = tmp_path / "shown", tmp_path / "logs"
    shown.mkdir()
    logs.mkdir()
    (shown / "note").write_text("seen\n")
    task = harbor_tasks["interceptor/fix-calc"]
    async with DockerSandbox(image=task.image, workdir=task.workdir) as box:
        assert (box.workspace / "calc.py").read_text().startswith("def add")  # seeded from the image's /app
        result = await box.exec("pwd; cat /tests/note; echo w > /logs/out; touch /tests/x", timeout_s=60,
                                binds=(Bind(shown, "/tests"), Bind(logs, "/logs", writable=True)))  # fmt: skip
    assert result.output.splitlines()[:2] == ["/app", "seen"] and "Read-only file system" in result.output
    assert (logs / "out").read_text() == "w\n" and not (shown / "x").exists()


async def test_a_box_without_a_file_system_of_its_own_refuses_binds(tmp_path):
    from agents.sandbox.base import LocalSandbox

    async with LocalSandbox() as box:
        with pytest.raises(AgentConfigError, match="cannot show host paths"):
            await box.exec("true", timeout_s=10, binds=(Bind(tmp_path, "/tests"),))


@docker
def test_a_trl_environment_runs_a_harbor_task_in_its_workdir_and_grades_with_its_verifier(harbor_tasks):
    from trainer.rl.environment import TaskEnvironment, grader_reward
    from trainer.rl.environment_host import SandboxHost

    host = SandboxHost()
    try:
        env = TaskEnvironment(list(harbor_tasks.values()), host=host)
        env.reset(task_id="interceptor/fix-calc")
        assert env.bash(command="pwd").splitlines()[1] == "/app"
        assert "return a - b" in env.read_file(path="calc.py")
        assert grader_reward([env]) == [0.0]
        env.reset(task_id="interceptor/fix-calc")
        env.bash(command="sed -i 's/return a - b/return a + b/' calc.py")
        assert grader_reward([env]) == [1.0]
    finally:
        host.close()
