"""Harbor as the rollout driver (`agents.harbor.driver`): real Harbor (its own Python 3.12 venv, scripts/setup-harbor.sh)
runs each rollout as a trial with its Docker environment and its installed agents (Pi, Claude Code), whose model is an
Interceptor rollout reached across a Docker network (the box port on the trial network's gateway, not loopback). The
same task gets the same reward from Interceptor's own runner; Harbor's failures (an environment that does not start,
an agent that cannot be installed, a verifier past its timeout) are failure causes with no reward; the box reaches
the rollout routes and nothing else of the server; nothing of a trial is left behind and the secret is in no file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agents import PiAgent
from agents.errors import AgentConfigError
from agents.harbor.driver import HarborConfig, HarborDriver, harbor_program
from agents.harbor.network import LABEL
from agents.harbor.trials import read_outcome
from agents.runner import Runner, RunnerConfig
from agents.sources import load_tasks
from agents.specs.packages import PI
from tests.agents.agent_runs import MAX_MODEL_LEN, bash_call, require_agent
from tests.invariants import assert_token_exact

from .test_docker_sandbox import WHY_NOT
from .test_swe import server  # noqa: F401  (fixture: a server on port 0 in front of the scripted upstream)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
_HARBOR_WHY_NOT = WHY_NOT or (None if harbor_program() else "Harbor is not installed: run scripts/setup-harbor.sh")
harbor = pytest.mark.skipif(_HARBOR_WHY_NOT is not None, reason=f"Harbor driver: {_HARBOR_WHY_NOT}")


def _claude_bash(command: str) -> str:
    """Claude Code's shell tool, `Bash(command)`, in Qwen's tool-call format."""
    return "<tool_call>\n" + json.dumps({"name": "Bash", "arguments": {"command": command}}) + "\n</tool_call>"


def _driver(tmp_path: Path, **config) -> HarborDriver:
    return HarborDriver(HarborConfig(trials_dir=tmp_path / "trials", **config))


def _trial_networks() -> list[str]:
    listed = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label={LABEL}"], capture_output=True,
                            text=True, timeout=30, check=True)  # fmt: skip
    return listed.stdout.split()


async def _run_by_harbor(server, driver: HarborDriver, task_dir: Path):  # noqa: F811
    tasks = load_tasks(task_dir, harbor_runs=True)
    driver.check(server, tasks)
    (record,) = await Runner(server, RunnerConfig(driver=driver)).run_tasks(tasks, n=1)
    return record


def _copy(tmp_path: Path, name: str = "fix-calc") -> Path:
    copied = tmp_path / "tasks" / name
    shutil.copytree(EXAMPLES / name, copied)
    return copied


def _tool_outputs(record) -> list[str]:
    return [m["content"] for t in record.trace for m in t["new_messages"] if m["role"] == "tool"]


# --------------------------------------------------------------------------------------- end to end


@harbor
async def test_pi_run_by_harbor_earns_the_verifiers_1_token_exact_as_interceptors_own_runner_does(
        server, scripted, tmp_path, monkeypatch):  # noqa: F811
    handles, opened = [], server.open_rollout
    monkeypatch.setattr(server, "open_rollout", lambda **kw: handles.append(opened(**kw)) or handles[-1])
    fix = bash_call("sed -i 's/a - b/a + b/' calc.py && python3 -c 'import calc; print(calc.add(2, 3))'")
    scripted.script(fix, "Fixed add.")
    record = await _run_by_harbor(server, _driver(tmp_path, agent="pi"), EXAMPLES / "fix-calc")
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert record.metadata["agent"] == "harbor:pi"
    assert_token_exact(record, scripted.calls)
    assert _tool_outputs(record) == ["5\n"]  # the command ran in Harbor's box, in the image's WORKDIR
    (trial,) = [event for event in record.events if event["kind"] == "harbor_trial"]
    assert set(trial["phases"]) == {"environment_setup", "agent_setup", "agent_execution", "verifier"}
    # Interceptor's own runner, the same task and the same policy: the same reward
    scripted.script(fix, "Fixed add.")
    pi = PiAgent(binary=require_agent(PI), context_window=MAX_MODEL_LEN)
    (own,) = await Runner(server, RunnerConfig(agent=pi)).run_tasks(load_tasks(EXAMPLES / "fix-calc"))
    assert own.status == "ok" and own.reward == record.reward, (own.failure, own.events)
    # nothing left behind: no trial network (nor a container on one), and the rollout's secret in no file Harbor kept
    assert _trial_networks() == []
    kept = [path for path in (tmp_path / "trials").rglob("*") if path.is_file()]
    secret = handles[0].secret.encode()
    assert kept and not [path for path in kept if secret in path.read_bytes()]


@harbor
async def test_claude_code_run_by_harbor_writes_the_greeting_and_earns_1_token_exact(server, scripted, tmp_path):  # noqa: F811
    scripted.script(_claude_bash("mkdir -p /app/out && echo 'hello, harbor' > /app/out/greeting.txt"), "Done.")
    record = await _run_by_harbor(server, _driver(tmp_path, agent="claude-code"), EXAMPLES / "write-greeting")
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)
    assert record.metadata["agent"] == "harbor:claude-code"
    assert_token_exact(record, scripted.calls)
    assert scripted.calls, "Claude Code spoke to the rollout (Anthropic Messages)"


_PROBE = r"""python3 - <<'EOF'
import json, os, socket, urllib.request, urllib.error
base = json.load(open('/tmp/harbor-pi-agent/models.json'))['providers']['harbor-endpoint']['baseUrl']
root = base.split('/rollout/')[0]
def status(url, key=None):
    request = urllib.request.Request(url, headers={'Authorization': f'Bearer {key}'} if key else {})
    try:
        return urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
host = root.split('//')[1].split(':')[0]
try:
    socket.create_connection((host, MAIN_PORT), timeout=5).close(); main = 'open'
except OSError as e:
    main = type(e).__name__
print(json.dumps({'root': root, 'own': status(base + '/models', 'a-guess'), 'nokey': status(base + '/models'),
                  'other': status(root + '/rollout/OTHER/v1/models', 'a-guess'), 'admin': status(root + '/rollouts'),
                  'metrics': status(root + '/metrics'), 'health': status(root + '/health'), 'main_port': main,
                  'key_in_tool_env': any('INTERCEPTOR' in name for name in os.environ)}))
EOF"""


@harbor
async def test_the_box_reaches_the_rollout_routes_across_a_network_boundary_and_nothing_else(server, scripted,
                                                                                          tmp_path):  # noqa: F811
    other = server.open_rollout()  # another live rollout, whose id the box is given but not its secret
    main_port = server.url.rsplit(":", 1)[1]
    scripted.script(bash_call(_PROBE.replace("MAIN_PORT", main_port).replace("OTHER", other.id)), "Probed.")
    record = await _run_by_harbor(server, _driver(tmp_path, agent="pi"), EXAMPLES / "fix-calc")
    assert record.status == "ok", (record.failure, record.events)
    (output,) = _tool_outputs(record)
    assert output.strip().startswith("{"), output
    seen = json.loads(output.strip().splitlines()[-1])
    host = re.match(r"http://([\d.]+):\d+$", seen["root"]).group(1)
    assert not host.startswith("127."), seen  # a Docker network's gateway: another namespace, not loopback
    # the rollout routes are there, each behind its secret (which the agent's own tools are not given) ...
    assert (seen["own"], seen["nokey"], seen["other"], seen["key_in_tool_env"]) == (401, 401, 401, False), seen
    assert len(record.trace) == 2  # ... and the agent, which holds it, reached its rollout twice from the box
    # ... and nothing else of the server is
    assert (seen["admin"], seen["metrics"], seen["health"]) == (404, 404, 404), seen
    assert seen["main_port"] == "ConnectionRefusedError", seen  # the server's own port listens on loopback only
    await server.finish_rollout(other.id)


# ------------------------------------------------------------------------------------------- faults


@harbor
async def test_an_environment_that_fails_to_start_is_a_sandbox_failure_with_no_reward(server, tmp_path):  # noqa: F811
    task = _copy(tmp_path)
    with open(task / "environment" / "Dockerfile", "a") as dockerfile:
        dockerfile.write("RUN exit 3\n")
    record = await _run_by_harbor(server, _driver(tmp_path, agent="pi"), task)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "sandbox", record.failure
    assert "exit" in record.failure.message and record.trace == []
    assert _trial_networks() == []


@harbor
async def test_an_agent_that_fails_to_install_is_an_agent_failure_with_no_reward(server, tmp_path):  # noqa: F811
    # Harbor's own installer fetches curl, nvm and Node.js from the internet, which the trial's network does not
    # reach: it retries for minutes, so the test gives the set-up 5 s
    driver = _driver(tmp_path, agent="pi", install="harbor", api_format="openai_chat_completions", setup_timeout_s=5)
    record = await _run_by_harbor(server, driver, EXAMPLES / "fix-calc")
    assert record.status == "failed" and record.reward is None and record.failure.cause == "agent", record.failure
    assert "AgentSetupTimeoutError" in record.failure.message and record.trace == []


@harbor
async def test_a_verifier_past_its_timeout_is_a_grader_failure_with_no_reward(server, scripted, tmp_path):  # noqa: F811
    task = _copy(tmp_path)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n")
    toml = (task / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 120.0", "[verifier]\ntimeout_sec = 2.0")
    (task / "task.toml").write_text(toml)
    scripted.script("Nothing to do.")
    record = await _run_by_harbor(server, _driver(tmp_path, agent="pi"), task)
    assert record.status == "failed" and record.reward is None and record.failure.cause == "grader", record.failure
    assert "VerifierTimeoutError" in record.failure.message


# ------------------------------------------------------------------------------------ what is refused


def test_an_agent_with_no_box_install_is_refused_naming_those_that_have_one(tmp_path):
    with pytest.raises(AgentConfigError, match="no box install here; these do: pi, claude-code, codex"):
        HarborConfig(agent="aider")
    with pytest.raises(AgentConfigError, match="give the agent's api_format"):
        HarborConfig(agent="aider", install="harbor")
    with pytest.raises(AgentConfigError, match="'modal' box cannot mount this host's agent installs"):
        HarborConfig(agent="pi", environment="modal")


@harbor
async def test_a_remote_environment_needs_the_box_listen_address_and_tasks_must_be_harbors(server, tmp_path):  # noqa: F811
    tasks = load_tasks(EXAMPLES, harbor_runs=True)
    with pytest.raises(AgentConfigError, match="'daytona' boxes are not on this host: start the server with box_listen"):
        _driver(tmp_path, agent="pi", environment="daytona", install="harbor",
                api_format="openai_chat_completions").check(server, tasks)
    jsonl = load_tasks(Path(__file__).resolve().parents[2] / "examples" / "tasks" / "arithmetic.jsonl")
    with pytest.raises(AgentConfigError, match="the Harbor driver runs Harbor tasks"):
        _driver(tmp_path, agent="pi").check(server, jsonl)


# ------------------------------------------------------------------------------- Harbor's results read


def _result(tmp_path: Path, **fields) -> Path:
    trial = tmp_path / "trial"
    trial.mkdir(exist_ok=True)
    (trial / "result.json").write_text(json.dumps(fields))
    return trial


@pytest.mark.parametrize(("fields", "reward", "cause"), [
    ({"verifier_result": {"rewards": {"reward": 1.0}}}, 1.0, None),
    ({"verifier_result": {"rewards": {"score": 0.25}}}, 0.25, None),  # one value under another name
    ({"verifier_result": {"rewards": {"reward": True}}}, None, "grader"),  # a bool is no reward
    ({"verifier_result": {"rewards": {"a": 1.0, "b": 0.0}}}, None, "grader"),  # which one?
    ({"verifier_result": None}, None, "grader"),
    ({"exception_info": {"exception_type": "EnvironmentStartTimeoutError", "exception_message": "slow"}}, None, "sandbox"),
    ({"exception_info": {"exception_type": "AgentSetupTimeoutError", "exception_message": ""}}, None, "agent"),
    ({"exception_info": {"exception_type": "AgentTimeoutError", "exception_message": ""},
      "verifier_result": {"rewards": {"reward": 1.0}}}, None, "timeout"),  # a verified timeout is still no reward
    ({"exception_info": {"exception_type": "ApiRateLimitError", "exception_message": ""}}, None, "agent"),
    ({"exception_info": {"exception_type": "RewardFileNotFoundError", "exception_message": ""}}, None, "grader"),
    ({"exception_info": {"exception_type": "RuntimeError", "exception_message": "Agent setup failed: x"}}, None, "agent"),
    ({"exception_info": {"exception_type": "OSError", "exception_message": "?"},
      "environment_setup": {"started_at": "2026-01-01T00:00:00Z"},
      "verifier": {"started_at": "2026-01-01T00:00:09Z"}}, None, "grader"),  # in the phase that started last
])  # fmt: skip
def test_harbors_result_is_a_reward_or_a_failure_cause_never_both(tmp_path, fields, reward, cause):
    outcome = read_outcome(_result(tmp_path, **fields))
    assert (outcome.reward, outcome.cause) == (reward, cause)


def test_a_trial_without_a_result_is_a_sandbox_failure(tmp_path):
    assert read_outcome(tmp_path).cause == "sandbox"
    (tmp_path / "result.json").write_text("{not json")
    assert read_outcome(tmp_path).cause == "sandbox"


# ------------------------------------------------------------------------------------------ training


@harbor
async def test_a_grpo_step_is_fed_by_harbor_trials(tiny_model_dir, tmp_path):
    """TRL's AsyncGRPOTrainer takes one step on samples from Harbor trials of Pi on the embedded policy (the local
    engine): the reward is Harbor's verifier's (here the parity of Pi's output length, so a group has a spread)."""
    from interceptor import read_records
    from trainer.train_main import TrainConfig, train

    config = TrainConfig(tasks=Path(__file__).resolve().parents[1] / "data" / "harbor" / "parity", model=tiny_model_dir,
                         driver="harbor", harbor_agent="pi", out=tmp_path / "run", max_tokens=8, num_generations=4,
                         samples_per_step=4, max_steps=1, learning_rate=1e-3, concurrency=4)  # fmt: skip
    result = await train(config)
    assert result.failed is None and result.steps == 1, result
    assert result.samples and result.engine_weight_version >= 2  # the cold sync and the step reached the engine
    records = list(read_records(config.out / "rollouts.jsonl"))
    assert records and {r.metadata["agent"] for r in records} == {"harbor:pi"}
    graded = [r for r in records if r.status == "ok"]
    assert len({r.reward for r in graded}) == 2  # the group trained on had a spread of Harbor's rewards
    assert all(any(e["kind"] == "harbor_trial" for e in r.events) for r in graded)


# --------------------------------------------------------------------- what Harbor is given (no Docker)

_FAKE_HARBOR = """#!{python}
# Stands in for `harbor trial start -c FILE`: keeps what it was given, and writes a result with reward 1.
import json, os, pathlib, sys
config = json.loads(pathlib.Path(sys.argv[sys.argv.index("-c") + 1]).read_text())
pathlib.Path({seen!r}).write_text(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "config": config}}))
trial = pathlib.Path(config["trials_dir"]) / config["trial_name"]
trial.mkdir(parents=True)
(trial / "result.json").write_text(json.dumps({{"verifier_result": {{"rewards": {{"reward": 1.0}}}}}}))
"""


async def test_a_remote_environment_is_given_the_box_listen_url_its_credentials_and_nothing_else(
        scripted, tiny_model_dir, tmp_path, monkeypatch):
    import sys

    from interceptor.config import ServerConfig, UpstreamConfig
    from interceptor.server import InterceptionServer

    seen = tmp_path / "seen.json"
    fake = tmp_path / "harbor"
    fake.write_text(_FAKE_HARBOR.format(python=sys.executable, seen=str(seen)))
    fake.chmod(0o755)
    monkeypatch.setenv("DAYTONA_API_KEY", "daytona-credential")
    monkeypatch.setenv("INTERCEPTOR_ADMIN_TOKEN", "never-for-harbor")
    monkeypatch.setenv("MY_SETTING", "asked-for")
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, max_model_len=4096,
                          box_listen="127.0.0.2:0", box_url="https://boxes.example.org")  # fmt: skip
    async with InterceptionServer(config) as server:
        driver = HarborDriver(HarborConfig(agent="claude-code", environment="daytona", harbor=fake, install="harbor",
                                           api_format="anthropic_messages", agent_kwargs=(("skip_install", "true"),),
                                           environment_kwargs=(("target", "eu"),), pass_env=("MY_SETTING",)))  # fmt: skip
        tasks = load_tasks(EXAMPLES / "write-greeting", harbor_runs=True)
        driver.check(server, tasks)
        (record,) = await Runner(server, RunnerConfig(driver=driver)).run_tasks(tasks)
    assert record.status == "ok" and record.reward == 1.0, record.failure
    given = json.loads(seen.read_text())
    agent, environment = given["config"]["agent"], given["config"]["environment"]
    assert agent["base_url"] == f"https://boxes.example.org/rollout/{record.rollout_id}"  # Anthropic's SDK adds /v1
    assert (agent["name"], agent["model_name"], agent["model_api_format"]) == (
        "claude-code", "anthropic/policy", "anthropic_messages")
    assert environment["type"] == "daytona" and environment["kwargs"] == {"target": "eu"}
    assert agent["kwargs"] == {"skip_install": "true"} and environment["mounts"] is None  # nothing of this host's
    env = given["env"]
    assert env["DAYTONA_API_KEY"] == "daytona-credential" and env["MY_SETTING"] == "asked-for"
    assert "INTERCEPTOR_ADMIN_TOKEN" not in env and env[agent["model_api_key_name"]]  # the key, by name only
    assert env[agent["model_api_key_name"]] not in json.dumps(given["config"])


def test_harbor_options_without_the_harbor_driver_are_refused():
    import argparse

    from trainer.drivers import harbor_driver

    base = dict(driver="interceptor", harbor_agent="pi", harbor_env="docker", harbor_install="box",
                harbor_api_format=None, harbor_trials=None, harbor_env_kwarg=[], harbor_pass_env=[])  # fmt: skip
    assert harbor_driver(argparse.Namespace(**base)) is None
    with pytest.raises(SystemExit, match="--harbor-trials: only with --driver harbor"):
        harbor_driver(argparse.Namespace(**{**base, "harbor_trials": "kept"}))
    with pytest.raises(SystemExit, match="--harbor-env-kwarg is KEY=VALUE"):
        harbor_driver(argparse.Namespace(**{**base, "driver": "harbor", "harbor_env_kwarg": ["flavor"]}))
