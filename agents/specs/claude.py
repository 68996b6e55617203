"""Claude Code (`@anthropic-ai/claude-code`, pinned in `agents.specs.packages`) as an agent spec.

It speaks the Anthropic Messages API only: the server's `/rollout/<id>/v1/messages` dialect. Configuration, all in
the rollout's own HOME:
- `ANTHROPIC_BASE_URL` is the rollout's base without `/v1` (Claude Code posts `/v1/messages?beta=true`);
- the secret is in no environment variable (Claude Code hands its environment to every Bash tool process): it is
  printed by an `apiKeyHelper` script (`~/.claude/key`, 0700) named in `~/.claude/settings.json`, which Claude Code
  runs and sends as `x-api-key`;
- `ANTHROPIC_MODEL` and `ANTHROPIC_SMALL_FAST_MODEL` are the served model (side requests such as titles use the
  small model; both reach the same policy and are recorded, side requests as their own samples);
- no outside traffic: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`, `DISABLE_TELEMETRY`, `DISABLE_AUTOUPDATER`,
  `DISABLE_ERROR_REPORTING`, `DISABLE_BUG_COMMAND`;
- `CLAUDE_CODE_MAX_RETRIES` (default 2 here; Claude Code's own is 10 over ~3 minutes): a failing upstream costs a
  few requests, not a storm, and the server's retry budget per turn bounds the upstream calls anyway;
- `IS_SANDBOX=1`, without which Claude Code refuses `--dangerously-skip-permissions` as root.

Run: `claude -p --dangerously-skip-permissions --output-format text` with the instruction on stdin. Its shell tool
is `Bash` (`command`, `timeout`, `description`, ...); it compacts when the server answers "prompt is too long".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agents.errors import AgentConfigError
from agents.specs.packages import CLAUDE, find_binary
from agents.specs.spec import AgentLaunch, AgentRollout, BoxFile, private_json, program_paths

__all__ = ["ClaudeAgent"]


@dataclass(frozen=True, kw_only=True)
class ClaudeAgent:
    name: ClassVar[str] = "claude"

    binary: Path | None = None  # default: the pinned install, then `claude` on PATH
    max_retries: int = 2  # CLAUDE_CODE_MAX_RETRIES
    max_output_tokens: int | None = None  # CLAUDE_CODE_MAX_OUTPUT_TOKENS; None: Claude Code's own (32000)
    extra_args: tuple[str, ...] = ()  # placed before `-p`, e.g. ("--max-turns", "20")

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise AgentConfigError("max_retries must be >= 0")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise AgentConfigError("max_output_tokens must be positive")

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        binary = find_binary(CLAUDE, self.binary)
        config_dir = rollout.home / ".claude"
        helper = config_dir / "key"
        files = (BoxFile(helper, f"#!/bin/sh\nprintf '%s' {shlex.quote(rollout.secret)}\n".encode(), 0o700),
                 private_json(config_dir / "settings.json", {"apiKeyHelper": str(helper)}))
        env = {
            "HOME": str(rollout.home),
            "CLAUDE_CONFIG_DIR": str(config_dir),
            "ANTHROPIC_BASE_URL": rollout.base_url.removesuffix("/").removesuffix("/v1"),
            "ANTHROPIC_MODEL": rollout.model,
            "ANTHROPIC_SMALL_FAST_MODEL": rollout.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries),
            "IS_SANDBOX": "1",
        }
        if self.max_output_tokens is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_output_tokens)
        return AgentLaunch(
            argv=(str(binary), *self.extra_args, "-p", "--dangerously-skip-permissions", "--output-format", "text"),
            env=env,
            cwd=rollout.workspace,
            stdin=rollout.instruction.encode(),
            files=files,
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )
