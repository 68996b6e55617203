"""Codex CLI (`@openai/codex`, pinned in `agents.specs.packages`) as an agent spec.

It speaks the OpenAI Responses API only (`wire_api = "responses"`): the server's `/rollout/<id>/v1/responses`
dialect. Configuration, in `$CODEX_HOME/config.toml` (0600, in the rollout's own HOME):
- a model provider `interceptor` with the rollout's `base_url`, `wire_api = "responses"`, the secret as its
  `experimental_bearer_token` (in the 0600 file, not in the environment that its `exec_command` tool processes
  inherit), and `request_max_retries` / `stream_max_retries` (default 2 here; Codex makes 30 attempts in ~25 s on a
  500 otherwise): a failing upstream costs a few requests, not a storm;
- `[analytics] enabled = false` and `[features] plugins = false`: no outside traffic; `web_search` and
  `image_generation` off: built-in tools, which the Responses dialect refuses. Sub-agents are on (`multi_agent_v1`, a
  `namespace` tool: `spawn_agent`, `wait_agent`, ...): each is a chain of the rollout's tree under the turn whose
  `spawn_agent` call opened it; `sub_agents=False` turns them off (`[agents] enabled = false`);
- `approval_policy = "never"`, `sandbox_mode = "danger-full-access"`: the rollout's sandbox is the boundary, Codex's
  own (Landlock/seccomp) would need privileges the sandbox does not give;
- `shell_environment_policy`: the tool processes inherit the core variables only; `allow_login_shell = false`:
  by default `exec_command` runs `bash -lc`, whose /etc/profile resets PATH, so the rollout's `answer` command was
  "command not found" (seen with 0.169.0).

Run: `codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --ephemeral -` with the
instruction on stdin. Its shell tool is the function `exec_command` (`{"cmd": ...}`); it compacts through the same
endpoint (`x-codex-turn-metadata` says `request_kind: "compaction"`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agents.errors import AgentConfigError
from agents.specs.packages import CODEX, find_binary
from agents.specs.spec import AgentLaunch, AgentRollout, BoxFile, program_paths

__all__ = ["CodexAgent"]

_PROVIDER = "interceptor"
# Off: outside traffic (plugins), and a built-in tool the Responses dialect refuses (image_generation).
_FEATURES_OFF = ("plugins", "image_generation")


def _toml(value: object) -> str:
    """A TOML string, integer or boolean (a JSON string literal is a valid TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


@dataclass(frozen=True, kw_only=True)
class CodexAgent:
    name: ClassVar[str] = "codex"

    binary: Path | None = None  # default: the pinned install, then `codex` on PATH
    context_window: int = 32768  # tell Codex the policy's max_model_len (model_context_window)
    max_retries: int = 2  # request_max_retries and stream_max_retries
    extra_args: tuple[str, ...] = ()  # placed after `exec`
    sub_agents: bool = True  # Codex's multi-agent tools (spawn_agent and the rest)

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.context_window < 1:
            raise AgentConfigError("max_retries must be >= 0 and context_window positive")

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        binary = find_binary(CODEX, self.binary)
        codex_home = rollout.home / ".codex"
        top = {
            "model": rollout.model,
            "model_provider": _PROVIDER,
            "model_context_window": self.context_window,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "web_search": "disabled",  # a built-in tool the policy cannot serve
            "allow_login_shell": False,  # a login shell resets PATH, losing the rollout's `answer` command
        }
        provider = {
            "name": _PROVIDER,
            "base_url": rollout.base_url,
            "wire_api": "responses",
            "experimental_bearer_token": rollout.secret,
            "request_max_retries": self.max_retries,
            "stream_max_retries": self.max_retries,
        }
        lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
        lines += ["", f"[model_providers.{_PROVIDER}]", *(f"{k} = {_toml(v)}" for k, v in provider.items())]
        lines += ["", "[analytics]", "enabled = false", "", "[features]"]
        lines += [f"{feature} = false" for feature in _FEATURES_OFF]
        if not self.sub_agents:
            lines += ["", "[agents]", "enabled = false"]
        lines += ["", "[shell_environment_policy]", 'inherit = "core"']
        config = BoxFile(codex_home / "config.toml", ("\n".join(lines) + "\n").encode(), 0o600)
        return AgentLaunch(
            argv=(str(binary), "exec", *self.extra_args, "--skip-git-repo-check",
                  "--dangerously-bypass-approvals-and-sandbox", "--ephemeral", "-"),  # fmt: skip
            env={"HOME": str(rollout.home), "CODEX_HOME": str(codex_home)},
            cwd=rollout.workspace,
            stdin=rollout.instruction.encode(),
            files=(config,),
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )
