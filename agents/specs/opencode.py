"""OpenCode (`opencode-ai`, a native binary, pinned in `agents.specs.packages`) as an agent spec.

Config (0600, at `$HOME/.config/interceptor/opencode.json`, passed as `OPENCODE_CONFIG`):

    {"model": "P/M", "small_model": "P/M", "autoupdate": false, "share": "disabled",
     "compaction": {"auto": true, "prune": false, "reserved": R},
     "provider": {P: {"npm": "@ai-sdk/openai-compatible", "name": ...,
                      "options": {"baseURL": ..., "apiKey": ...},
                      "models": {M: {"name": M, "limit": {"context": W, "input": W, "output": ...}}}}}}

The rollout gets its own HOME and XDG_* directories, and `OPENCODE_DISABLE_AUTOUPDATE`, `_MODELS_FETCH`,
`_LSP_DOWNLOAD`, `_SHARE`. Run: `opencode run -m P/M` with the instruction on stdin, which OpenCode takes verbatim
(a single argv message with spaces arrives wrapped in literal quotes; words as separate arguments lose newlines).

Compaction (on by default; seen with 1.18.33):
- OpenCode compacts on its own once a step's usage (prompt + completion, read from the streamed reply's `usage`)
  reaches `limit.input - compaction.reserved` (without `limit.input`: context minus the output limit, `reserved`
  unused). It then sends a summary request (its compaction agent: a system prompt opening "You are a context
  summarization agent", no tools, the history serialised into one user message), and resumes with [system, user
  "What did we do so far?", assistant <summary>, user "Continue if you have next steps, ..."]: a rewritten history,
  so a new sample (fork), and the summary an auxiliary one. `compaction_reserve` leaves room for the next tool
  output and reply, so that this happens before the policy's context overflows.
- A context-length 400 is recognised too (its overflow patterns include `maximum context length is \\d+ tokens`, the
  words `errors.ContextLengthExceeded` uses) and compacts the same way, but OpenCode also publishes it as a session
  error: `opencode run` prints it and exits 1 although the run went on to its answer. A 400 on a history that holds
  nothing to compact (the system prompt, tools and instruction alone overflow) makes it summarise and retry the
  same 400 forever (5-8 requests a second until the wall-clock limit): the policy's context must hold the first
  request (~7.2k tokens with Qwen's tokenizer) with room to spare.
- Pruning old tool outputs (`compaction.prune`, off) would rewrite tool messages mid-run without a summary.

Also seen with 1.18.33:
- For every config directory it uses (here `$XDG_CONFIG_HOME/opencode`) OpenCode starts a background
  `npm install @opencode-ai/plugin` (~30 MB into `$HOME/.npm`, registry traffic) unless the directory already has a
  `node_modules` and a `package-lock.json` naming the package. Per rollout that is wasted work, so by default the spec
  writes those two markers (`skip_plugin_install`); plugins in that directory then do not work.
- It makes a title request (its own system prompt, no tools, `max_tokens` = the output limit) concurrently with the
  first turn, usually before it; the server records it as an auxiliary sample.
- The first request comes 2-4 s after launch on 2 cores (up to 7 s on a loaded machine). Tools: `bash` (`command`,
  `timeout`, `workdir`), `edit`, `glob`, `grep`, `read`, `skill`, `task`, `todowrite`, `webfetch`, `write`; its bash
  tool has a default timeout of 2 minutes and runs commands in their own session (detached).
- `grep`/`glob` use ripgrep, which OpenCode downloads (15.1.0, from GitHub) into `$XDG_CACHE_HOME/opencode/bin` when
  `rg` is not on PATH: per rollout, since the cache is the rollout's. Put `rg` on PATH.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agents.errors import AgentConfigError
from agents.specs.packages import OPENCODE, find_binary
from agents.specs.spec import AgentLaunch, AgentRollout, BoxFile, check_provider, private_json, program_paths

__all__ = ["OpenCodeAgent"]

_PLUGIN_PACKAGE = "@opencode-ai/plugin"


@dataclass(frozen=True, kw_only=True)
class OpenCodeAgent:
    name: ClassVar[str] = "opencode"

    binary: Path | None = None  # default: the pinned install, then `opencode` on PATH
    provider: str = "interceptor"
    context_window: int = 32768  # tell OpenCode the policy's max_model_len
    max_tokens: int = 4096  # OpenCode sends it as max_tokens on every request
    compaction: bool = True  # summarise the history when it nears the context window (a fork in the trajectory)
    compaction_reserve: int | None = None  # compact when a step's tokens reach context_window minus this (None: a
    # quarter of the window, at most 8192, at least max_tokens: room for the next tool output and the reply)
    skip_plugin_install: bool = True
    config: Mapping[str, object] = field(default_factory=dict)  # merged (top level) over the generated config
    extra_args: tuple[str, ...] = ()  # after `run -m P/M`, e.g. ("--print-logs",)

    def __post_init__(self) -> None:
        check_provider(self.provider, context_window=self.context_window, max_tokens=self.max_tokens)
        if self.compaction_reserve is not None and not 0 < self.compaction_reserve < self.context_window:
            raise AgentConfigError("need 0 < compaction_reserve < context_window")

    @property
    def reserved(self) -> int:
        """`compaction.reserved`: compaction_reserve, or its default."""
        if self.compaction_reserve is not None:
            return self.compaction_reserve
        return min(max(self.max_tokens, min(8192, self.context_window // 4)), self.context_window - 1)

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        binary = find_binary(OPENCODE, self.binary)
        home = rollout.home
        xdg = {
            "XDG_CONFIG_HOME": home / ".config",
            "XDG_DATA_HOME": home / ".local" / "share",
            "XDG_CACHE_HOME": home / ".cache",
            "XDG_STATE_HOME": home / ".local" / "state",
        }
        model = f"{self.provider}/{rollout.model}"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": model,
            "small_model": model,  # the title request goes to the policy too, not to a catalogue model
            "autoupdate": False,
            "share": "disabled",
            "compaction": {"auto": self.compaction, "prune": False, "reserved": self.reserved},
            "provider": {
                self.provider: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Interceptor",
                    "options": {"baseURL": rollout.base_url, "apiKey": rollout.secret},
                    "models": {
                        rollout.model: {
                            "name": rollout.model,
                            "limit": {
                                "context": self.context_window,
                                "input": self.context_window,  # what `compaction.reserved` is taken from
                                "output": self.max_tokens,
                            },
                        }
                    },
                }
            },
            **self.config,
        }
        config_file = xdg["XDG_CONFIG_HOME"] / "interceptor" / "opencode.json"
        files = [private_json(config_file, config)]
        if self.skip_plugin_install:
            files += _mark_plugin_installed(xdg["XDG_CONFIG_HOME"] / "opencode")
        env = {
            "HOME": str(home),
            **{key: str(path) for key, path in xdg.items()},
            "OPENCODE_CONFIG": str(config_file),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        return AgentLaunch(
            argv=(str(binary), "run", "-m", model, *self.extra_args),
            env=env,
            cwd=rollout.workspace,
            stdin=rollout.instruction.encode(),
            files=tuple(files),
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )


def _mark_plugin_installed(config_dir: Path) -> list[BoxFile]:
    """OpenCode skips its dependency install in a directory whose node_modules exists and whose lock file's root
    already lists every wanted package (checked against 1.18.33's `Npm.install`)."""
    lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": {_PLUGIN_PACKAGE: OPENCODE.version}}}}
    return [BoxFile(config_dir / "node_modules", None, 0o700), private_json(config_dir / "package-lock.json", lock)]
