"""One Harbor trial as the Harbor driver asks for it (`trial_config`) and what it ended as (`read_outcome`).

The config is Harbor's own trial config (`harbor trial schema`), written as JSON for `harbor trial start -c`:
the task directory; the agent by Harbor's name with the rollout's URL as its base URL, the rollout's secret as the
key (named by `model_api_key_name`: the value travels in Harbor's environment, never in a file), and its API format;
the environment type with Interceptor's mounts and compose override.

Harbor's result (`<trials dir>/<trial>/result.json`) becomes a reward or a failure cause, never both: a trial with
an exception is a failure whatever its verifier wrote (an agent that timed out is `timeout`, as the runner's own
rollouts are), and one without is the verifier's reward, which must be there and be a number.

    Harbor's exception                                         failure cause
    EnvironmentStartTimeoutError, SandboxBuildFailedError,     sandbox   (the box did not come up)
      HealthcheckError, an error before the agent's set-up
    AgentSetupTimeoutError, an error in the agent's set-up     agent     (it could not be installed or configured)
    AgentTimeoutError                                          timeout
    NonZeroAgentExitCodeError and its Api*Error kinds          agent (upstream when the model's last calls failed)
    VerifierTimeoutError, RewardFileNotFoundError,             grader    (the verifier could not decide)
      RewardFileEmptyError, VerifierOutputParseError, any error in the verifier's phase
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

__all__ = ["KEY_VARIABLE", "TrialOutcome", "read_outcome", "trial_config"]

KEY_VARIABLE = "INTERCEPTOR_ROLLOUT_KEY"  # the variable Harbor reads the rollout's secret from

_CAUSES = {
    "EnvironmentStartTimeoutError": "sandbox",
    "SandboxBuildFailedError": "sandbox",
    "HealthcheckError": "sandbox",
    "AgentSetupTimeoutError": "agent",
    "AgentTimeoutError": "timeout",
    "VerifierTimeoutError": "grader",
    "RewardFileNotFoundError": "grader",
    "RewardFileEmptyError": "grader",
    "VerifierOutputParseError": "grader",
    "AddTestsDirError": "grader",
    "DownloadVerifierDirError": "grader",
}
# In the order a trial runs them: an exception with no known type is put in the phase that had started last.
_PHASES = (("environment_setup", "sandbox"), ("agent_setup", "agent"), ("agent_execution", "agent"),
           ("verifier", "grader"))  # fmt: skip


def trial_config(*, task_dir: Path, trials_dir: Path, trial_name: str, agent: str, model: str, base_url: str,
                 api_format: str, environment: dict, skip_install: bool = True, mounts: list[dict] = (),
                 extra_compose: tuple[Path, ...] = (), agent_env: dict[str, str] | None = None,
                 agent_kwargs: dict | None = None, setup_timeout_s: float | None = None) -> dict:  # fmt: skip
    return {
        "task": {"path": str(task_dir)},
        "trials_dir": str(trials_dir),
        "trial_name": trial_name,
        "agent": {
            "name": agent,
            # LiteLLM's provider names, which Harbor parses a model name with: the rollout's served model behind it
            "model_name": f"{'anthropic' if api_format == 'anthropic_messages' else 'openai'}/{model}",
            "base_url": base_url,
            "model_api_key_name": KEY_VARIABLE,
            "model_api_format": api_format,
            # a box install is mounted: Harbor's installer must not run; else the caller's kwargs decide
            "kwargs": {**(agent_kwargs or {}), "skip_install": True} if skip_install else dict(agent_kwargs or {}),
            "env": dict(agent_env or {}),
            "override_setup_timeout_sec": setup_timeout_s,
        },
        "environment": {
            **environment,  # {"type": ...}, or {"import_path": ...} for a plug-in of Harbor's
            "delete": True,
            "mounts": list(mounts) or None,
            "extra_docker_compose": [str(path) for path in extra_compose],
        },
    }


@dataclass(frozen=True)
class TrialOutcome:
    reward: float | None  # the verifier's, when the trial ended without an exception
    cause: str | None = None  # else the failure cause (the table above)
    message: str = ""
    exception_type: str | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds each phase of the trial took


def read_outcome(trial_dir: Path) -> TrialOutcome:
    """The trial's reward or failure, from its result.json (its absence is a failure of the trial: `sandbox`)."""
    path = trial_dir / "result.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return TrialOutcome(None, "sandbox", f"Harbor wrote no result for the trial ({path} is missing)")
    except (OSError, ValueError) as exc:
        return TrialOutcome(None, "sandbox", f"Harbor's result for the trial cannot be read: {exc}")
    if not isinstance(result, dict):
        return TrialOutcome(None, "sandbox", "Harbor's result for the trial is not a JSON object")
    phases = _phases(result)
    error = result.get("exception_info")
    if isinstance(error, dict):
        kind = str(error.get("exception_type") or "")
        message = str(error.get("exception_message") or "")[-2000:]
        cause = _cause(kind, message, result)
        return TrialOutcome(None, cause, f"Harbor: {kind}: {message}".strip(), kind, phases)
    rewards = (result.get("verifier_result") or {}).get("rewards")
    reward = _reward(rewards)
    if reward is None:
        return TrialOutcome(None, "grader", f"the verifier's rewards are not one number: {str(rewards)[:300]}",
                            phases=phases)  # fmt: skip
    return TrialOutcome(reward, phases=phases)


def _cause(kind: str, message: str, result: dict) -> str:
    if kind in _CAUSES:
        return _CAUSES[kind]
    if kind.endswith("Error") and kind.startswith(("Api", "NonZeroAgentExitCode", "ContextWindow", "OutputToken")):
        return "agent"
    if message.startswith("Agent setup failed"):
        return "agent"
    started = [cause for phase, cause in _PHASES if isinstance(result.get(phase), dict)
               and result[phase].get("started_at")]  # fmt: skip
    return started[-1] if started else "sandbox"


def _reward(rewards: object) -> float | None:
    """Harbor's `{"reward": x}`, or a single value under another name; a bool is not a reward."""
    if not isinstance(rewards, dict) or not rewards:
        return None
    value = rewards.get("reward") if "reward" in rewards else (next(iter(rewards.values())) if len(rewards) == 1 else None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _phases(result: dict) -> dict[str, float]:
    seconds = {}
    for phase, _ in _PHASES:
        times = result.get(phase)
        if isinstance(times, dict) and times.get("started_at") and times.get("finished_at"):
            try:
                start, end = (datetime.fromisoformat(str(times[key]).replace("Z", "+00:00"))
                              for key in ("started_at", "finished_at"))  # fmt: skip
            except ValueError:
                continue
            seconds[phase] = round((end - start).total_seconds(), 3)
    return seconds
