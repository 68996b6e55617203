"""mini-swe-agent (PyPI `mini-swe-agent`, pinned in `agents.specs.packages`) as an agent spec.

It is Python over litellm: one `bash` tool (`command`), every call a non-streamed chat completion with `model`,
`messages` and `tools` only (plus `max_tokens` when the spec sets one); each command runs in a new subshell in the
working directory with the agent's environment (so `answer` on PATH works), with a 30 s timeout by default. It ends
when a command's output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (its prompt says so), after
`max_consecutive_format_errors` replies in a row without a tool call (3), or at `step_limit` calls (none by
default: the rollout's wall limit ends it). It exits 0 in each of these; 1 on an error it did not expect.

Files, in `$HOME/.config/mini-swe-agent` (= `MSWEA_GLOBAL_CONFIG_DIR`), 0600: `interceptor.yaml` (JSON, which YAML
reads), merged by mini over its own `mini.yaml` (named by absolute path: a `mini.yaml` in the workspace would be
read first otherwise). It holds what the agent needs to run unattended (`agent.mode: yolo`, `confirm_exit: false`,
no cost limit: litellm knows no price for the policy), the task (`run.task`: not in argv), and the model: the
rollout's base URL and secret in `model.model_kwargs` (`api_base`, `api_key`, `custom_llm_provider: openai`), which
litellm passes to the OpenAI client, so the secret is in no environment variable the agent's commands inherit.
mini writes its trajectory, which repeats the whole config (the secret included), to `/dev/null`: the rollout's
record holds the conversation.

Seen with 2.4.6 on 2 busy cores: the first request 6-10 s after launch (litellm's import); without
`LITELLM_LOCAL_MODEL_COST_MAP` its import fetches litellm's price list from GitHub (retried, then the bundled one);
a failed call is retried `MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT` times with 4-60 s waits (10 by default: minutes
on a server that refuses a request; 3 here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agents.errors import AgentConfigError
from agents.specs.packages import MINI_SWE, find_binary
from agents.specs.spec import AgentLaunch, AgentRollout, private_json, program_paths

__all__ = ["MiniSweAgent"]

_RETRY_ATTEMPTS = 3  # calls per step before mini gives up on the model


@dataclass(frozen=True, kw_only=True)
class MiniSweAgent:
    name: ClassVar[str] = "mini-swe-agent"

    binary: Path | None = None  # the venv's python (default: the pinned install), or a `mini` on PATH
    max_tokens: int | None = None  # sent as max_tokens on every call; None: not sent (the server's default)
    step_limit: int = 0  # model calls; 0: none (mini's default)
    command_timeout_s: int = 30  # each command's (mini's default)
    config: Mapping[str, object] = field(default_factory=dict)  # merged over the generated config, key by key

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise AgentConfigError("max_tokens must be >= 1")
        if self.step_limit < 0 or self.command_timeout_s < 1:
            raise AgentConfigError("step_limit must be >= 0 and command_timeout_s >= 1")

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        binary = find_binary(MINI_SWE, self.binary)
        config_dir = rollout.home / ".config" / "mini-swe-agent"
        model_kwargs: dict[str, object] = {"api_base": rollout.base_url, "api_key": rollout.secret,
                                           "custom_llm_provider": "openai", "drop_params": True}
        if self.max_tokens is not None:
            model_kwargs["max_tokens"] = self.max_tokens
        config = _merge({
            "run": {"task": rollout.instruction},
            "agent": {"mode": "yolo", "confirm_exit": False, "cost_limit": 0, "step_limit": self.step_limit},
            "environment": {"timeout": self.command_timeout_s},
            "model": {"model_name": rollout.model, "cost_tracking": "ignore_errors", "model_kwargs": model_kwargs},
        }, self.config)
        written = config_dir / "interceptor.yaml"
        if "=" in str(written):
            raise AgentConfigError(f"mini reads a config path holding '=' as key=value: {written}")
        return AgentLaunch(
            argv=(*MINI_SWE.command(binary), "--config", str(_builtin_config(binary)), "--config", str(written),
                  "--output", "/dev/null"),
            env={"HOME": str(rollout.home), "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),
                 "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(_RETRY_ATTEMPTS), "NO_COLOR": "1", **dict(MINI_SWE.env)},
            cwd=rollout.workspace,
            stdin=b"",  # mini asks nothing when configured; an empty stdin that ends says so if it ever does
            files=(private_json(written, config),),
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )


def _builtin_config(binary: Path) -> Path:
    """mini's own `mini.yaml` in the install `binary` runs from (its venv's site-packages)."""
    venv = Path(binary).absolute().parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/minisweagent/config/mini.yaml"))
    if not found:
        raise AgentConfigError(f"no minisweagent/config/mini.yaml in {venv}: {binary} is not a mini-swe-agent install")
    return found[-1]


def _merge(base: dict, over: Mapping) -> dict:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) and isinstance(merged.get(key),
                                                                                                dict) else value
    return merged
