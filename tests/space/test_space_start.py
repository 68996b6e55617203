"""The Space's start script, run here in CPU mode as the container runs it (no Docker needed): the interception
server, the viewer, the admin API and `/metrics` answer on the one port while a short real run (Pi on the embedded
default, two GRPO steps) completes; then the viewer keeps the run on view at the same address."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import requests

from agents.specs.packages import PI
from tests.agents.agent_runs import require_agent

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "admin-secret-for-the-test"
STEPS = 2

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _turns(metrics_text: str) -> float:
    return sum(float(v) for v in re.findall(r"^interceptor_turns_total\{[^}]*\} (\S+)$", metrics_text, re.M))


def _wait(predicate, what: str, process: subprocess.Popen, log: Path, bound_s: float = 900.0):
    deadline = time.monotonic() + bound_s  # a bound for a stuck start, not a speed requirement
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except requests.RequestException:
            value = None
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"start.sh exited ({process.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen:\n{log.read_text()[-4000:]}")


def test_the_start_script_serves_viewer_server_admin_and_metrics_on_one_port_while_a_run_completes(
        tmp_path, tool_model_dir):
    require_agent(PI)
    port = _free_port()
    out = tmp_path / "run"
    log = tmp_path / "start.log"
    env = {
        **os.environ,
        "PORT": str(port), "SPACE_HARDWARE": "cpu", "SPACE_OUT": str(out), "SPACE_MODEL_DIR": str(tool_model_dir),
        "SPACE_SET": f"max_steps={STEPS} num_generations=2 samples_per_step=2 concurrency=2",
        "INTERCEPTOR_ADMIN_TOKEN": ADMIN, "INTERCEPTOR": str(Path(sys.executable).with_name("interceptor")),
        "PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("HF_TOKEN", None)
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with open(log, "w") as sink:
        space = subprocess.Popen(["bash", "space_app/start.sh"], cwd=ROOT, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: requests.get(f"{base}/health", timeout=5).ok, "the server answering", space, log)
        page = requests.get(f"{base}/", timeout=10)  # / redirects to the viewer
        assert page.ok and page.url == f"{base}/view/" and "run viewer" in page.text
        assert requests.get(f"{base}/view/api/run", timeout=10).json()["files"] == [str(out / "rollouts.jsonl")]
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 401  # the admin token guards it
        unknown = requests.get(f"{base}/rollouts/not-a-rollout", headers=admin, timeout=10)
        assert unknown.status_code == 404 and "not-a-rollout" in unknown.json()["error"]["message"]
        assert requests.get(f"{base}/rollouts/not-a-rollout", timeout=10).status_code == 401

        # the counters move while the run runs, and the viewer sees the records it writes
        first = _turns(requests.get(f"{base}/metrics", headers=admin, timeout=10).text)
        _wait(lambda: _turns(requests.get(f"{base}/metrics", headers=admin, timeout=10).text) > first,
              "a turn counted in /metrics", space, log)
        _wait(lambda: requests.get(f"{base}/view/api/run", timeout=10).json()["rollouts"] > 0,
              "a rollout in the viewer", space, log)

        _wait(lambda: "the run is over" in log.read_text(), "the run's end", space, log)
        steps = [orjson.loads(line) for line in (out / "metrics.jsonl").read_bytes().splitlines()]
        assert [s["step"] for s in steps if "reward" in s] == list(range(1, STEPS + 1))
        assert (out / "final" / "config.json").is_file() and (out / "final" / "tokenizer.json").is_file()
        # no HF_TOKEN: the push says so and does nothing (it runs after "the run is over" is printed)
        _wait(lambda: "nothing pushed" in log.read_text(), "the push's word", space, log)

        # after the run, `interceptor view` keeps the run on view at the same address
        def after() -> dict | None:
            run = requests.get(f"{base}/view/api/run", timeout=10).json()
            return run if run["steps"] >= STEPS else None

        run = _wait(after, "the viewer after the run", space, log)
        assert run["rollouts"] >= STEPS * 2 and run["curves"]["reward"]
        assert ADMIN not in log.read_text()  # the secret is never printed
    finally:
        os.killpg(space.pid, signal.SIGTERM)
        try:
            space.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(space.pid, signal.SIGKILL)
            space.wait()
