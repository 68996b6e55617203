"""Agents: specs that configure unmodified CLI agents (Pi, OpenCode, Claude Code, Codex, mini-swe-agent, any OpenAI-API
program) for one rollout, and sandboxes that run them with limits.

    spec = PiAgent(context_window=32768)
    async with LocalSandbox() as box:
        launch = spec.prepare(AgentRollout(base_url=handle.base_url, secret=handle.secret, model="policy",
                                           workspace=box.workspace, home=box.home, instruction=task))
        result = await box.run(launch, limits=RunLimits(wall_s=900, idle_s=120), activity=heartbeat)

`agents.specs.install.install_agent("pi")` (any name in `PACKAGES`) installs a pinned version into the user's cache
(not imported here, so that `python -m agents.specs.install` runs cleanly).
"""

from __future__ import annotations

from agents.errors import AgentConfigError, AgentError, AgentNotInstalled, InstallError
from agents.sandbox.base import Heartbeat, LocalSandbox, LocalSandboxConfig, Outcome, RunLimits, RunResult, Sandbox
from agents.specs.claude import ClaudeAgent
from agents.specs.codex import CodexAgent
from agents.specs.command import CommandAgent
from agents.specs.mini_swe import MiniSweAgent
from agents.specs.opencode import OpenCodeAgent
from agents.specs.packages import OPENCODE, PACKAGES, PI, AgentPackage, find_binary
from agents.specs.pi import PiAgent
from agents.specs.registry import AGENTS, AgentKind, AgentSettings, build_agent
from agents.specs.spec import AgentLaunch, AgentRollout, AgentSpec

__all__ = [
    "AGENTS",
    "OPENCODE",
    "PACKAGES",
    "PI",
    "AgentConfigError",
    "AgentKind",
    "AgentError",
    "AgentLaunch",
    "AgentNotInstalled",
    "AgentPackage",
    "AgentRollout",
    "AgentSettings",
    "AgentSpec",
    "ClaudeAgent",
    "CodexAgent",
    "CommandAgent",
    "Heartbeat",
    "InstallError",
    "LocalSandbox",
    "LocalSandboxConfig",
    "MiniSweAgent",
    "OpenCodeAgent",
    "Outcome",
    "PiAgent",
    "RunLimits",
    "RunResult",
    "Sandbox",
    "build_agent",
    "find_binary",
]

