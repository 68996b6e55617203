"""Error types of the agents package.

`AgentError` is the base: callers that launch agents catch it once, at the boundary, and turn it into a failed
rollout (an infrastructure fault, never a reward). What happens while an agent runs is not an exception: the
sandbox reports it as a `RunResult` (exited, timeout, idle, cancelled, spawn_failed).
"""

from __future__ import annotations

__all__ = ["AgentConfigError", "AgentError", "AgentNotInstalled", "InstallError", "RolloutFailed"]


class AgentError(Exception):
    """Something about an agent is wrong before it runs."""


class AgentConfigError(AgentError, ValueError):
    """An agent spec, a rollout description or a sandbox setting is invalid."""


class AgentNotInstalled(AgentError):
    """The agent's program is neither in the install cache nor on PATH; the message says how to install it."""


class InstallError(AgentError):
    """`npm install` of a pinned agent failed, or the installed program does not report the pinned version."""


class RolloutFailed(Exception):
    """A rollout's attempt ended without a grade: `cause` (agent, sandbox, timeout, idle, limit, upstream, grader,
    policy_stop, cancelled) is its failure cause; it carries no reward. Raised by a rollout driver (the runner's
    own boxes, or Harbor's trials) and turned into the record's failure once, by the runner."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause
