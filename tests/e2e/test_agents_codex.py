"""The real Codex CLI (pinned in agents.specs.packages) against the interception server's Responses dialect, in front of
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

from agents.specs.codex import CodexAgent
from agents.specs.packages import CODEX
from tests.agents.agent_runs import MAX_MODEL_LEN, check_first_request, interception_server, require_agent, run_agent
from tests.invariants import assert_compaction_tree, assert_token_exact

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


async def test_codex_compacts_its_history_through_the_same_endpoint_and_goes_on(scripted, tiny_model_dir):
    """Told a 35k-token context window, Codex compacts on its own once its history nears it: a request without tools
    whose client_metadata says `request_kind: "compaction"`, then the conversation resumes from the handoff
    summary. The compaction is an auxiliary sample whose reason says so, the resumed conversation a new one;
    nothing is spliced, and every sample is token-exact."""
    codex = CodexAgent(binary=require_agent(CODEX), context_window=35_000)
    calls = [exec_call(f"seq {i * 1000} {i * 1000 + 600}") for i in range(1, 4)]
    scripted.script(*calls, "<summary>Three lists of numbers were printed.</summary>", "All done.")
    async with interception_server(scripted, tiny_model_dir) as server:
        run = await run_agent(codex, server, instruction="List some numbers.")

    assert run.result.ok, run.result
    kinds = [json.loads(r.body["client_metadata"]["x-codex-turn-metadata"])["request_kind"] for r in run.requests
             if r.path.endswith("/v1/responses")]  # fmt: skip
    assert kinds.count("compaction") == 1 and kinds[-1] == "turn", kinds
    main, compaction, resumed = run.record.samples
    assert len(main.turns) == 3 and not main.auxiliary
    assert compaction.auxiliary and compaction.fork_reason.startswith("compaction request")
    assert not resumed.auxiliary and resumed.fork_reason
    assert [(e["request_kind"], e["extended"]) for e in run.record.events if e["kind"] == "side_request"] == [
        ("compaction", False)]
    assert_token_exact(run.record, scripted.calls)
    assert_compaction_tree(run.record, main, compaction, resumed, keep="compaction-codex")
