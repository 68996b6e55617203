"""The agents this project runs, in one table. `interceptor run --agent NAME`, `train`, `evaluate`, `replay`,
`agents install` and the spec tests all read it, so adding an agent is its spec module, one line here and its tests.

    spec = build_agent("pi", AgentSettings(context_window=32768, max_tokens=512))

An entry names the spec class, the npm package it is installed from (None: a program of the user's own), how to
build a spec from the settings every caller has (the policy's context window, an output-token cap, a command line),
and whether `interceptor train` takes it (its tool loop has been trained through in this project's tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agents.errors import AgentConfigError
from agents.specs.claude import ClaudeAgent
from agents.specs.codex import CodexAgent
from agents.specs.command import CommandAgent
from agents.specs.mini_swe import MiniSweAgent
from agents.specs.opencode import OpenCodeAgent
from agents.specs.packages import CLAUDE, CODEX, MINI_SWE, OPENCODE, PI, AgentPackage
from agents.specs.pi import PiAgent
from agents.specs.spec import AgentSpec

__all__ = ["AGENTS", "AgentKind", "AgentSettings", "build_agent", "installable", "trainable"]

DEFAULT_MAX_TOKENS = 512  # Pi's and OpenCode's output cap when the caller sets none


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """What every caller knows when it starts an agent."""

    context_window: int  # the policy's max_model_len
    max_tokens: int | None = None  # the output-token cap per call; None: the agent's own default
    command: str | None = None  # the command agent's command line


@dataclass(frozen=True, kw_only=True)
class AgentKind:
    name: str
    spec: type
    package: AgentPackage | None  # what `agents install` installs; None: the user's own program
    build: Callable[[AgentSettings], AgentSpec]
    trainable: bool  # `interceptor train` takes it


def _command(settings: AgentSettings) -> AgentSpec:
    if not settings.command:
        raise AgentConfigError("the command agent needs a command line (--command, or `command` in the config)")
    return CommandAgent.from_command_line(settings.command)


AGENTS: dict[str, AgentKind] = {kind.name: kind for kind in (
    AgentKind(name="pi", spec=PiAgent, package=PI, trainable=True, build=lambda s: PiAgent(
        context_window=s.context_window, max_tokens=s.max_tokens or DEFAULT_MAX_TOKENS)),
    AgentKind(name="opencode", spec=OpenCodeAgent, package=OPENCODE, trainable=True, build=lambda s: OpenCodeAgent(
        context_window=s.context_window, max_tokens=s.max_tokens or DEFAULT_MAX_TOKENS)),
    AgentKind(name="claude", spec=ClaudeAgent, package=CLAUDE, trainable=False,
              build=lambda s: ClaudeAgent(max_output_tokens=s.max_tokens)),
    AgentKind(name="codex", spec=CodexAgent, package=CODEX, trainable=False,
              build=lambda s: CodexAgent(context_window=s.context_window)),
    AgentKind(name="mini-swe-agent", spec=MiniSweAgent, package=MINI_SWE, trainable=False,
              build=lambda s: MiniSweAgent(max_tokens=s.max_tokens)),
    AgentKind(name="command", spec=CommandAgent, package=None, trainable=True, build=_command),
)}


def build_agent(name: str, settings: AgentSettings) -> AgentSpec:
    kind = AGENTS.get(name)
    if kind is None:
        raise AgentConfigError(f"unknown agent {name!r}; known: {', '.join(AGENTS)}")
    return kind.build(settings)


def installable() -> tuple[str, ...]:
    """The agents `interceptor agents install` takes."""
    return tuple(name for name, kind in AGENTS.items() if kind.package is not None)


def trainable() -> tuple[str, ...]:
    """The agents `interceptor train` takes."""
    return tuple(name for name, kind in AGENTS.items() if kind.trainable)
