"""Pi (`@mariozechner/pi-coding-agent`, pinned in `agents.specs.packages`) as an agent spec.

Files, in `$HOME/.pi/agent` (= `PI_CODING_AGENT_DIR`), both 0600:
- `models.json`: `{"providers": {P: {"baseUrl", "api": "openai-completions", "apiKey", "compat":
  {"supportsDeveloperRole": false, "supportsReasoningEffort": false}, "models": [{"id", "contextWindow",
  "maxTokens", "reasoning"}]}}}`. Pi reads `apiKey` as: "!cmd" runs a shell command, a name of a set environment
  variable takes its value, anything else is the literal key (the secret is a bearer token, so it is literal).
- `settings.json`: auto-compaction off by default (`compaction`; `settings` may pass `{"compaction": {"enabled",
  "reserveTokens", "keepRecentTokens"}}`, defaults 16384 and 20000). With it off, a context-length 400 ends Pi with
  exit code 1 and the error on stderr.

Run: `pi --provider P --model M --no-session -p` with the instruction on stdin (Pi appends piped stdin to the
prompt in print mode, trimmed; a `-p "text"` argument starting with "-" or "@" would be read as a flag or a file).
`PI_OFFLINE=1` turns off its start-up network calls (version check, install telemetry).

Compaction, seen with 0.73.1 (why it stays off): Pi checks only when a prompt's agent loop ends (`agent_end`), never
between the turns of one run. At that point a context overflow, recognised by its patterns (our 400 matches
`maximum context length is \\d+ tokens` and `reduce the length of the messages`), makes it drop the failed turn,
send a summary request (system prompt "You are a context summarization assistant.", no tools, the history
serialised into one user message, `max_completion_tokens` 0.8 x reserveTokens, 0.5 x for the prefix of a turn too
long to keep) and continue from [system, user "...compacted into the following summary: <summary>...", the kept
recent messages]: the summary an auxiliary sample, the resumed conversation a forked one. Without an overflow, the
threshold (context > contextWindow - reserveTokens, from the reply's `usage`) is checked only after the final answer,
so a print-mode run never compacts mid-run and may send one summary request after its answer. And print mode (`-p`)
does not wait for the overflow recovery (upstream issue earendil-works/pi#4512): it reads the failed turn's state,
disposes the session and returns, so the continuation runs detached to its end, its answer is never printed, Pi
exits 0 whatever happens, and a second overflow is not recovered. If the summary request itself overflows (its
max_completion_tokens must fit beside the serialised history), Pi exits 0 at once with no output.

Seen with 0.73.1: the first request comes 1.2-2.8 s after launch on 2 cores (node loading its modules); it always
streams with `stream_options.include_usage`, `store: false` and `max_completion_tokens` = `maxTokens`; tools `read`,
`bash` (`command`, `timeout`; no default timeout), `edit`, `write`. Its bash tool runs commands detached (their own
session); Pi ends them itself on SIGTERM, and the sandbox's subreaper when it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agents.specs.packages import PI, find_binary
from agents.specs.spec import AgentLaunch, AgentRollout, check_provider, private_json, program_paths

__all__ = ["PiAgent"]


@dataclass(frozen=True, kw_only=True)
class PiAgent:
    name: ClassVar[str] = "pi"

    binary: Path | None = None  # default: the pinned install, then `pi` on PATH
    provider: str = "interceptor"
    context_window: int = 32768  # tell Pi the policy's max_model_len
    max_tokens: int = 4096  # sent as max_completion_tokens on every turn
    reasoning: bool = False
    compaction: bool = False
    settings: Mapping[str, object] = field(default_factory=dict)  # merged over the generated settings.json
    extra_args: tuple[str, ...] = ()  # placed before `-p`, e.g. ("--no-context-files",)

    def __post_init__(self) -> None:
        check_provider(self.provider, context_window=self.context_window, max_tokens=self.max_tokens)

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        binary = find_binary(PI, self.binary)
        agent_dir = rollout.home / ".pi" / "agent"
        models = {
            "providers": {
                self.provider: {
                    "baseUrl": rollout.base_url,
                    "api": "openai-completions",
                    "apiKey": rollout.secret,
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [
                        {
                            "id": rollout.model,
                            "contextWindow": self.context_window,
                            "maxTokens": self.max_tokens,
                            "reasoning": self.reasoning,
                        }
                    ],
                }
            }
        }
        settings = {
            "compaction": {"enabled": self.compaction},
            "enableInstallTelemetry": False,
            "quietStartup": True,
            **self.settings,
        }
        files = (private_json(agent_dir / "models.json", models), private_json(agent_dir / "settings.json", settings))
        return AgentLaunch(
            argv=(
                str(binary),
                "--provider",
                self.provider,
                "--model",
                rollout.model,
                "--no-session",
                *self.extra_args,
                "-p",
            ),
            env={"HOME": str(rollout.home), "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"},
            cwd=rollout.workspace,
            stdin=rollout.instruction.encode(),
            files=files,
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )
