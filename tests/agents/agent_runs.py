"""Running a real agent against the interception server for the e2e tests (tests/e2e/test_agents_*.py).

    binary = require_agent(PI)                       # skip when not installed; fail under CI=true
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(PiAgent(binary=binary), server, instruction="...")

The agent talks to the server through a `RecordingProxy` (which keeps its raw requests and feeds the sandbox's idle
watchdog) and runs in a `LocalSandbox`. `run_agent` collects what the tests check before the sandbox is removed:
the workspace files, which files anywhere in the rollout's directories hold the secret, and the time from launch to
the first request.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents import AgentNotInstalled, AgentRollout, AgentSpec, Heartbeat, LocalSandbox, RunLimits, RunResult
from agents.specs.packages import AgentPackage, find_binary
from interceptor import InterceptionServer, RolloutRecord, ServerConfig, UpstreamConfig
from tests.agents.recording_proxy import CapturedRequest, RecordingProxy
from tests.fakes import ScriptedUpstream

__all__ = ["AgentRun", "bash_call", "check_first_request", "interception_server", "require_agent", "run_agent"]

DATA = Path(__file__).resolve().parents[1] / "data"
# The agents' system prompts and tool schemas are long, and the test tokenizer is a small BPE (~20k tokens for
# OpenCode's first request): leave room, or the server rightly answers "context length exceeded".
MAX_MODEL_LEN = 65536
LIMITS = RunLimits(wall_s=180, idle_s=90)
SAVE_ENV = "INTERCEPTOR_SAVE_AGENT_REQUESTS"  # =1: rewrite tests/data/<agent>_first_request.json from this run


def require_agent(package: AgentPackage) -> Path:
    """The agent's program, or skip the test saying how to install it. Under CI (CI=true) a missing agent fails the
    test instead, so a broken CI image cannot turn these tests green by skipping them."""
    try:
        return find_binary(package)
    except AgentNotInstalled as exc:
        message = f"{exc} (or run scripts/setup-agents.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def bash_call(command: str) -> str:
    """What the "model" says to call the `bash` tool both agents have (argument `command`), in Qwen's format."""
    call = {"name": "bash", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@asynccontextmanager
async def interception_server(
    scripted: ScriptedUpstream, model_dir: Path, *, keepalive_s: float = 5.0
) -> AsyncIterator[InterceptionServer]:
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url),
        model_dir=model_dir,
        max_model_len=MAX_MODEL_LEN,
        keepalive_s=keepalive_s,
        stream_hold_s=keepalive_s,  # headers go out after one keepalive period, so slow turns exercise comments
    )
    async with InterceptionServer(config) as server:
        yield server


@dataclass(frozen=True, kw_only=True)
class AgentRun:
    result: RunResult
    record: RolloutRecord
    requests: list[CapturedRequest]  # everything the agent sent, in arrival order
    files: dict[str, str]  # the workspace's top-level files after the run
    files_with_secret: set[str]  # every file under the rollout's directories holding the secret, relative
    secret: str
    rollout_dir: Path  # removed by now; what to replace in saved requests
    first_request_s: float | None

    @property
    def chat_requests(self) -> list[CapturedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]


async def run_agent(
    spec: AgentSpec, server: InterceptionServer, *, instruction: str, limits: RunLimits = LIMITS
) -> AgentRun:
    handle = server.open_rollout()
    heartbeat = Heartbeat()
    async with RecordingProxy(target=server.url, on_activity=heartbeat.beat) as proxy, LocalSandbox() as box:
        rollout = AgentRollout(
            base_url=proxy.rebase(handle.base_url),
            secret=handle.secret,
            model=server.config.served_model_name,
            workspace=box.workspace,
            home=box.home,
            instruction=instruction,
        )
        launch = spec.prepare(rollout)
        launched = time.monotonic()
        result = await box.run(launch, limits=limits, activity=heartbeat)
        files = {p.name: p.read_text(errors="replace") for p in box.workspace.iterdir() if p.is_file()}
        holding = {
            str(p.relative_to(box.root))
            for p in box.root.rglob("*")
            if p.is_file() and not p.is_symlink() and handle.secret.encode() in p.read_bytes()
        }
        rollout_dir = box.root
    record = await server.finish_rollout(handle.id)
    return AgentRun(
        result=result,
        record=record,
        requests=list(proxy.requests),
        files=files,
        files_with_secret=holding,
        secret=handle.secret,
        rollout_dir=rollout_dir,
        first_request_s=proxy.requests[0].at - launched if proxy.requests else None,
    )


def check_first_request(agent: str, package: AgentPackage, run: AgentRun, request: CapturedRequest) -> None:
    """Compare the agent's tools with tests/data/<agent>_first_request.json (written when missing, or rewritten
    with INTERCEPTOR_SAVE_AGENT_REQUESTS=1): the saved request is what a tiny model learns these agents' tool calls
    from, so a new agent version that changes its tools must show up here."""
    path = DATA / f"{agent}_first_request.json"
    text = json.dumps(request.body)
    for private, public in ((run.secret, "<secret>"), (str(run.rollout_dir), "/tmp/interceptor-rollout"),
                            (str(Path.home()), "~")):
        text = text.replace(json.dumps(private)[1:-1], public)
    body = json.loads(text)
    if os.environ.get(SAVE_ENV) == "1" or not path.exists():
        saved = {
            "agent": agent,
            "package": package.spec,
            "note": (
                f"The first chat request {agent} sent to the interception server, captured by "
                f"tests/e2e/test_agents_{agent.replace('-', '_')}.py; the rollout secret is removed, the rollout's "
                "temporary directory is written /tmp/interceptor-rollout and the home directory ~."
            ),
            "request": body,
        }
        path.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    saved_tools = json.loads(path.read_text())["request"].get("tools")
    assert body.get("tools") == saved_tools, f"{agent}'s tools changed; rerun with {SAVE_ENV}=1 if that is intended"
