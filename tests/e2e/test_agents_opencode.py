"""The real OpenCode (pinned in agents.specs.packages) against the interception server in front of a scripted policy.

The "model" first calls OpenCode's `bash` tool, then answers in text. OpenCode must run the command in its workspace,
send the result back as a `tool` message, and the rollout's record must hold both turns as one token-exact sample;
OpenCode's concurrent title request must be an auxiliary sample beside it. The tool's environment must hold no
credential: OpenCode reads the secret from its 0600 config file. Skipped when OpenCode is not installed
(scripts/setup-agents.sh); failed instead under CI=true.

The title request and the first turn race to the policy, so both are scripted the same reply (the bash call): which
one arrives first cannot change what the test sees. The title generator ignores a tool call.
"""

from __future__ import annotations

import pytest

from agents import OpenCodeAgent
from agents.specs.packages import OPENCODE
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import bash_call, check_first_request, interception_server, require_agent, run_agent
from tests.e2e.test_agents_pi import assert_no_credentials_in
from tests.fakes import Slow
from tests.invariants import assert_compaction_tree, assert_token_exact

pytestmark = pytest.mark.e2e

TOOLS = ["bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write"]


@pytest.fixture
def opencode() -> OpenCodeAgent:
    return OpenCodeAgent(binary=require_agent(OPENCODE), context_window=65536, max_tokens=512)


def split_title_and_turns(run):
    title = [r for r in run.chat_requests if not r.body.get("tools")]
    turns = [r for r in run.chat_requests if r.body.get("tools")]
    return title, turns


async def test_opencode_runs_its_bash_tool_and_the_title_request_is_auxiliary(opencode, scripted, tiny_model_dir):
    call = bash_call("env > env.txt; echo hi")
    scripted.script(call, call, "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(opencode, server, instruction="Write the environment to env.txt, then say hi.")
    print(f"\nopencode: first request {run.first_request_s:.2f} s after launch, run {run.result.seconds:.2f} s")

    assert run.result.ok, run.result
    assert "All done." in run.result.stdout
    assert "env.txt" in run.files, "the tool call was executed in the workspace"
    title, (first, second) = split_title_and_turns(run)
    assert len(title) == 1 and "title" in title[0].body["messages"][0]["content"]
    assert sorted(t["function"]["name"] for t in first.body["tools"]) == TOOLS
    tool_results = [m for m in second.body["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 1 and tool_results[0]["content"] == "hi\n"

    auxiliary = [s for s in run.record.samples if s.auxiliary]
    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(auxiliary) == 1 and len(auxiliary[0].turns) == 1, "the title request"
    assert len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)
    assert_no_credentials_in(run.files["env.txt"], run.secret)
    assert run.files_with_secret == {"home/.config/interceptor/opencode.json"}
    check_first_request("opencode", OPENCODE, run, first)


async def test_opencode_reads_through_keepalive_comments_of_slow_generations(opencode, scripted, tiny_model_dir):
    call = Slow(bash_call("echo slow > slow.txt"), 1.2)
    scripted.script(call, call, Slow("Done slowly.", 1.2))
    async with interception_server(scripted, tiny_model_dir, keepalive_s=0.3) as server:
        run = await run_agent(opencode, server, instruction="Write slow into slow.txt.")

    assert run.result.ok, run.result
    assert "Done slowly." in run.result.stdout and run.files["slow.txt"] == "slow\n"
    _, turns = split_title_and_turns(run)
    assert len(turns) == 2
    assert all(request.response.count(b": keepalive") >= 2 for request in run.chat_requests)
    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)


async def test_opencode_compacts_its_history_near_the_context_window_and_goes_on(scripted, tiny_model_dir):
    """Told a 30k-token window with 4k reserved, OpenCode compacts on its own once a step's usage passes 26k: a
    summary request without tools (its compaction agent), then the conversation resumes from the summary. The
    summary is an auxiliary sample whose reason says "compaction request", the resumed conversation a new sample;
    nothing is spliced, every sample is token-exact, and no request overflowed."""
    opencode = OpenCodeAgent(binary=require_agent(OPENCODE), context_window=30_000, max_tokens=512,
                             compaction_reserve=4096)
    calls = [bash_call(f"seq {i * 1000} {i * 1000 + 600}") for i in range(1, 4)]
    scripted.script(calls[0], *calls, "## Goal\nList numbers.\n## Progress\nThree lists printed.", "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(opencode, server, instruction="List some numbers.")

    assert run.result.ok and "All done." in run.result.stdout, run.result
    assert {r.status for r in run.chat_requests} == {200}
    main, resumed = [s for s in run.record.samples if not s.auxiliary]
    summaries = [s for s in run.record.samples if (s.fork_reason or "").startswith("compaction request")]
    assert len(run.record.samples) == 4, "the title, the main conversation, its summary, the resumed conversation"
    assert len(summaries) == 1 and summaries[0].auxiliary and len(summaries[0].turns) == 1
    assert len(main.turns) == 3 and main.index < summaries[0].index < resumed.index
    assert resumed.fork_reason and len(resumed.turns) == 1
    assert [(e["request_kind"], e["extended"]) for e in run.record.events if e["kind"] == "side_request"] == [
        ("compaction", False)]
    assert_token_exact(run.record, scripted.calls)
    assert_compaction_tree(run.record, main, summaries[0], resumed, keep="compaction-opencode")


async def test_opencode_compacts_on_a_context_overflow_and_goes_on_but_exits_1(scripted, tiny_model_dir):
    """Told a window larger than the policy's, OpenCode overflows it: the server's OpenAI-worded 400 ("maximum
    context length is N tokens") is recognised as an overflow, and OpenCode compacts and resumes as it does near
    its window, so the record is the same. But it also reports the 400 as a session error: `opencode run` prints
    it and exits 1 after the answer (why `compaction_reserve` keeps it ahead of the policy's window)."""
    opencode = OpenCodeAgent(binary=require_agent(OPENCODE), context_window=65_536, max_tokens=512)
    calls = [bash_call(f"seq {i * 1000} {i * 1000 + 600}") for i in range(1, 3)]
    scripted.script(calls[0], *calls, "## Goal\nList numbers.\n## Progress\nTwo lists printed.", "All done.")
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          max_model_len=26_000)  # OpenCode's first request is ~20k tokens of the test vocabulary
    async with InterceptionServer(config) as server:
        run = await run_agent(opencode, server, instruction="List some numbers.")

    assert run.result.exit_code == 1 and "All done." in run.result.stdout, run.result
    assert "maximum context length is 26000 tokens" in run.result.stderr
    assert [r.status for r in run.chat_requests].count(400) == 1
    main, resumed = [s for s in run.record.samples if not s.auxiliary]
    summaries = [s for s in run.record.samples if (s.fork_reason or "").startswith("compaction request")]
    assert len(run.record.samples) == 4 and len(summaries) == 1 and summaries[0].auxiliary
    assert len(main.turns) == 2 and main.index < summaries[0].index < resumed.index
    assert resumed.fork_reason and len(resumed.turns) == 1
    assert any(e["kind"] == "context_length_exceeded" for e in run.record.events)
    assert_token_exact(run.record, scripted.calls)
