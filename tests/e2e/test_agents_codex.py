"""The real Codex CLI (pinned in agents.packages) against the interception server's Responses dialect, in front of
a scripted policy.

The "model" first calls Codex's `exec_command` tool, then answers in text. Codex must run the command in its
workspace, send the result back as a `function_call_output` item with the whole history, and the rollout's record
must hold both turns as one token-exact sample. The tool's environment must hold no credential: the secret is in
the 0600 config.toml, never an environment variable. Skipped when Codex is not installed
(scripts/setup-agents.sh); failed instead under CI=true.
"""

from __future__ import annotations

import json

import pytest

from agents.codex import CodexAgent
from agents.packages import CODEX
from tests.agents.agent_runs import MAX_MODEL_LEN, check_first_request, interception_server, require_agent, run_agent
from tests.invariants import assert_token_exact

pytestmark = pytest.mark.e2e


def exec_call(command: str) -> str:
    """Codex's shell tool, `exec_command(cmd)`, in Qwen's tool-call format."""
    return "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": command}}) + "\n</tool_call>"


@pytest.fixture
def codex() -> CodexAgent:
    return CodexAgent(binary=require_agent(CODEX), context_window=MAX_MODEL_LEN)


async def test_codex_runs_its_exec_command_tool_and_both_turns_are_one_token_exact_sample(codex, scripted,
                                                                                          tiny_model_dir):
    scripted.script(exec_call("env > env.txt; echo hi"), "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(codex, server, instruction="Write the environment to env.txt, then say hi.")

    assert run.result.ok, run.result
    assert "All done." in run.result.stdout
    assert "env.txt" in run.files, "the tool call was executed in the workspace"
    first, second = [r for r in run.requests if r.path.endswith("/v1/responses")]
    assert "exec_command" in [tool["name"] for tool in first.body["tools"]]
    assert first.body["input"][0]["role"] == "developer"  # the system prompt, as a developer item
    outputs = [item for item in second.body["input"] if item.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "hi" in json.dumps(outputs[0]["output"])

    main = [s for s in run.record.samples if not s.auxiliary]
    assert len(main) == 1 and len(main[0].turns) == 2
    assert_token_exact(run.record, scripted.calls)
    env_dump = run.files["env.txt"]
    assert run.secret not in env_dump
    assert run.files_with_secret == {"home/.codex/config.toml"}
    check_first_request("codex", CODEX, run, first)
