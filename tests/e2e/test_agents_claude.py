"""The real Claude Code (pinned in agents.packages) against the interception server's Messages dialect, in front of
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

from agents.claude import ClaudeAgent
from agents.packages import CLAUDE
from tests.agents.agent_runs import check_first_request, interception_server, require_agent, run_agent
from tests.invariants import assert_token_exact

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

