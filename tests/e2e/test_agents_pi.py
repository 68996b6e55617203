"""The real Pi (pinned in agents.specs.packages) against the interception server in front of a scripted policy.

The "model" first calls Pi's `bash` tool, then answers in text. Pi must run the command in its workspace, send the
result back as a `tool` message, and the rollout's record must hold both turns as one token-exact sample. The tool's
environment must hold no credential: Pi reads the secret from its 0600 models.json, not from the environment.
Skipped when Pi is not installed (scripts/setup-agents.sh); failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from aiohttp import web

from agents import AgentRollout, Heartbeat, LocalSandbox, PiAgent, RunLimits
from agents.specs.packages import PI
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import bash_call, check_first_request, interception_server, require_agent, run_agent
from tests.fakes import Slow
from tests.invariants import assert_compaction_tree, assert_token_exact

pytestmark = pytest.mark.e2e


@pytest.fixture
def pi() -> PiAgent:
    return PiAgent(binary=require_agent(PI), context_window=65536, max_tokens=512)


def assert_no_credentials_in(env_dump: str, secret: str) -> None:
    assert secret not in env_dump
    names = {line.split("=", 1)[0] for line in env_dump.splitlines() if "=" in line}
    assert not {name for name in names if "API_KEY" in name or "TOKEN" in name or "SECRET" in name}


async def test_pi_runs_its_bash_tool_and_both_turns_are_one_token_exact_sample(pi, scripted, tiny_model_dir):
    scripted.script(bash_call("env > env.txt; echo hi"), "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(pi, server, instruction="Write the environment to env.txt, then say hi.")
    print(f"\npi: first request {run.first_request_s:.2f} s after launch, run {run.result.seconds:.2f} s")

    assert run.result.ok, run.result
    assert "All done." in run.result.stdout
    assert "env.txt" in run.files, "the tool call was executed in the workspace"
    first, second = run.chat_requests
    assert [t["function"]["name"] for t in first.body["tools"]] == ["read", "bash", "edit", "write"]
    tool_results = [m for m in second.body["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 1 and tool_results[0]["content"] == "hi\n"

    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(run.record.samples) == len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)
    assert_no_credentials_in(run.files["env.txt"], run.secret)
    assert run.files_with_secret == {"home/.pi/agent/models.json"}
    check_first_request("pi", PI, run, first)


async def test_pi_reads_through_keepalive_comments_of_slow_generations(pi, scripted, tiny_model_dir):
    scripted.script(Slow(bash_call("echo slow > slow.txt"), 1.2), Slow("Done slowly.", 1.2))
    async with interception_server(scripted, tiny_model_dir, keepalive_s=0.3) as server:
        run = await run_agent(pi, server, instruction="Write slow into slow.txt.")

    assert run.result.ok, run.result
    assert "Done slowly." in run.result.stdout and run.files["slow.txt"] == "slow\n"
    assert len(run.chat_requests) == 2
    assert all(request.response.count(b": keepalive") >= 2 for request in run.chat_requests)
    assert len(run.record.samples) == 1 and len(run.record.samples[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)



@pytest.fixture
async def stalled_stream():
    """An OpenAI chat endpoint that sends a stream's headers and first chunk, then nothing, ever: what Pi sees when
    a server or proxy wedges mid-stream. Yields its base URL and a heartbeat beaten when a request arrives."""
    heartbeat = Heartbeat()

    async def chat(request: web.Request) -> web.StreamResponse:
        heartbeat.beat()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "policy",
                 "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        await response.write(b"data: " + json.dumps(first).encode() + b"\n\n")
        await asyncio.Event().wait()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, handler_cancellation=True)  # the agent's disconnect ends the handler
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", heartbeat
    finally:
        await runner.cleanup()


async def test_pi_waiting_on_a_stream_that_stalled_is_ended_by_the_idle_watchdog(pi, stalled_stream):
    base_url, heartbeat = stalled_stream
    async with LocalSandbox() as box:
        rollout = AgentRollout(base_url=base_url, secret="stall-secret", model="policy", workspace=box.workspace,
                               home=box.home, instruction="Say something.")
        result = await box.run(pi.prepare(rollout), limits=RunLimits(wall_s=60, idle_s=3.0), activity=heartbeat)
    # Pi prints nothing while it waits and never gives up by itself: only the watchdog ends it.
    assert result.outcome == "idle", result


def processes_running(command: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if file.read().replace(b"\0", b" ").strip() == command.encode():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


async def test_a_timeout_ends_pi_and_the_detached_command_its_bash_tool_runs(pi, scripted, tiny_model_dir):
    # Pi runs tool commands in their own session, out of its process group; they must end with the run. (Pi ends
    # them itself on SIGTERM; the subreaper shim is what ends them when Pi cannot, see tests/agents/test_sandbox.py.)
    command = "sleep 317.5"
    scripted.script(bash_call(command))
    async with interception_server(scripted, tiny_model_dir) as server:
        running = asyncio.create_task(
            run_agent(pi, server, instruction="Wait.", limits=RunLimits(wall_s=8, idle_s=None))
        )
        while not processes_running(command) and not running.done():
            await asyncio.sleep(0.1)
        assert processes_running(command), "Pi started the tool command"
        run = await running
    assert run.result.outcome == "timeout"
    assert processes_running(command) == []


async def test_pi_compacts_on_a_context_overflow_and_goes_on_but_prints_no_answer(scripted, tiny_model_dir):
    """A 12k-token context that the fourth turn overflows: the server answers OpenAI's "maximum context length"
    400, Pi asks for a summary of the turn so far (a request without tools, its summariser's system prompt), then
    continues from the summary to its answer. The summary is an auxiliary sample whose reason says "compaction
    request", the resumed conversation a new sample; nothing is spliced, every sample is token-exact.

    Pi 0.73.1's print mode does not wait for that recovery: it has already read the failed turn's state, so it
    prints nothing and exits 0 once the resumed conversation ends (why compaction stays off by default)."""
    pi = PiAgent(binary=require_agent(PI), context_window=12_000, max_tokens=512,
                 settings={"compaction": {"enabled": True, "reserveTokens": 2048, "keepRecentTokens": 1000}})
    calls = [bash_call(f"seq {i * 1000} {i * 1000 + 600}") for i in range(1, 4)]
    summary = "## Original Request\nList numbers.\n## Early Progress\n- Three lists printed."
    scripted.script(*calls, summary, "All done.")
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          max_model_len=12_000)  # Pi's first request is ~5k tokens of the test vocabulary
    async with InterceptionServer(config) as server:
        run = await run_agent(pi, server, instruction="List some numbers.")

    assert run.result.exit_code == 0 and run.result.stdout == "", run.result
    assert [r.status for r in run.chat_requests] == [200, 200, 200, 400, 200, 200]
    assert b"All done." in run.chat_requests[-1].response, "the resumed conversation reached the answer"
    main, compaction, resumed = run.record.samples
    assert len(main.turns) == 3 and main.fork_reason is None and not main.auxiliary
    assert compaction.auxiliary and compaction.fork_reason.startswith("compaction request")
    assert not resumed.auxiliary and resumed.fork_reason and len(resumed.turns) == 1
    assert [(e["request_kind"], e["extended"]) for e in run.record.events if e["kind"] == "side_request"] == [
        ("compaction", False)]
    assert any(e["kind"] == "context_length_exceeded" for e in run.record.events)
    assert_token_exact(run.record, scripted.calls)
    assert_compaction_tree(run.record, main, compaction, resumed, keep="compaction-pi")
