"""The real Claude Code (pinned in agents.specs.packages) against the interception server's Messages dialect, in front of
a scripted policy.

The "model" first calls Claude Code's `Bash` tool, then answers in text. Claude Code must run the command in its
workspace, send the result back as a `tool_result` block, and the rollout's record must hold both turns as one
token-exact sample. The tool's environment must hold no credential: the secret comes from an apiKeyHelper script,
never an environment variable. Skipped when Claude Code is not installed (scripts/setup-agents.sh); failed instead
under CI=true.
"""

from __future__ import annotations

import json

import pytest

from agents.specs.claude import ClaudeAgent
from agents.specs.packages import CLAUDE
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.agents.agent_runs import check_first_request, interception_server, require_agent, run_agent
from tests.invariants import assert_compaction_tree, assert_token_exact

pytestmark = pytest.mark.e2e


def bash_call(command: str) -> str:
    """Claude Code's shell tool, `Bash(command)`, in Qwen's tool-call format."""
    return "<tool_call>\n" + json.dumps({"name": "Bash", "arguments": {"command": command}}) + "\n</tool_call>"


@pytest.fixture
def claude() -> ClaudeAgent:
    return ClaudeAgent(binary=require_agent(CLAUDE))


async def test_claude_code_runs_its_bash_tool_and_both_turns_are_one_token_exact_sample(claude, scripted,
                                                                                        tiny_model_dir):
    scripted.script(bash_call("env > env.txt; echo hi"), "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(claude, server, instruction="Write the environment to env.txt, then say hi.")

    assert run.result.ok, run.result
    assert "All done." in run.result.stdout
    assert "env.txt" in run.files, "the tool call was executed in the workspace"
    first, second = [r for r in run.requests if r.path.endswith("/v1/messages")]
    assert "Bash" in [tool["name"] for tool in first.body["tools"]]
    results = [block for message in second.body["messages"] if message["role"] == "user"
               for block in (message["content"] if isinstance(message["content"], list) else [])
               if block.get("type") == "tool_result"]  # fmt: skip
    assert len(results) == 1 and "hi" in json.dumps(results[0]["content"])

    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)
    env_dump = run.files["env.txt"]
    assert run.secret not in env_dump
    assert not [line for line in env_dump.splitlines() if line.startswith(("ANTHROPIC_API_KEY=", "ANTHROPIC_AUTH_TOKEN="))]
    assert run.files_with_secret == {"home/.claude/key"}
    check_first_request("claude", CLAUDE, run, first)



async def test_claude_code_compacts_when_the_prompt_is_too_long_and_goes_on(claude, scripted, tiny_model_dir):
    """A context small enough that the sixth turn does not fit: the server answers Anthropic's "prompt is too long",
    Claude Code asks for a summary of the history so far through the same endpoint (a compaction request), then
    continues from the summary. Each rewrite starts a new sample with its reason; nothing is spliced, and every
    sample is token-exact."""
    calls = [bash_call(f"seq {i * 1000} {i * 1000 + 600}") for i in range(1, 6)]
    summary = "<analysis>the user wants numbers listed</analysis>\n<summary>Five lists of numbers were printed.</summary>"
    scripted.script(*calls, summary, "All done.")
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          max_model_len=45_000)  # Claude Code's first prompt is ~33k tokens of the test vocabulary
    async with InterceptionServer(config) as server:
        run = await run_agent(claude, server, instruction="List some numbers.")

    assert run.result.ok and "All done." in run.result.stdout, run.result
    statuses = [r.status for r in run.requests if r.path.endswith("/v1/messages")]
    assert statuses.count(400) == 1, statuses
    main, compaction, resumed = run.record.samples
    assert len(main.turns) == 5 and main.fork_reason is None
    assert compaction.fork_reason.startswith("compaction request") and len(compaction.turns) == 1
    assert resumed.fork_reason and not resumed.auxiliary and len(resumed.turns) == 1
    assert [(e["request_kind"], e["extended"]) for e in run.record.events if e["kind"] == "side_request"] == [
        ("compaction", False)]
    assert any(e["kind"] == "context_length_exceeded" for e in run.record.events)
    assert_token_exact(run.record, scripted.calls)
    assert_compaction_tree(run.record, main, compaction, resumed, keep="compaction-claude")
