"""OpenCode (`opencode-ai`, a native binary, pinned in `agents.packages`) as an agent spec.

Config (0600, at `$HOME/.config/interceptor/opencode.json`, passed as `OPENCODE_CONFIG`):

    {"model": "P/M", "small_model": "P/M", "autoupdate": false, "share": "disabled",
     "compaction": {"auto": false, "prune": false},
     "provider": {P: {"npm": "@ai-sdk/openai-compatible", "name": ...,
                      "options": {"baseURL": ..., "apiKey": ...},
                      "models": {M: {"name": M, "limit": {"context": ..., "output": ...}}}}}}

The rollout gets its own HOME and XDG_* directories, and `OPENCODE_DISABLE_AUTOUPDATE`, `_MODELS_FETCH`,
`_LSP_DOWNLOAD`, `_SHARE`. Run: `opencode run -m P/M` with the instruction on stdin, which OpenCode takes verbatim
(a single argv message with spaces arrives wrapped in literal quotes; words as separate arguments lose newlines).

Seen with 1.18.33:
- With its default auto-compaction, a context-length 400 makes OpenCode summarise (a 200) and retry (the same 400)
  forever: ~8 requests a second until the wall-clock limit. Compaction and pruning of old tool outputs also rewrite
  the history (a fork in the trajectory), so both are off by default (`compaction`); a 400 then ends OpenCode with
  exit code 1 and the error on stderr.
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

from .packages import OPENCODE, find_binary
from .spec import AgentLaunch, AgentRollout, check_provider, program_paths, write_private_json

__all__ = ["OpenCodeAgent"]

_PLUGIN_PACKAGE = "@opencode-ai/plugin"


@dataclass(frozen=True, kw_only=True)
class OpenCodeAgent:
    name: ClassVar[str] = "opencode"

    binary: Path | None = None  # default: the pinned install, then `opencode` on PATH
    provider: str = "interceptor"
    context_window: int = 32768  # tell OpenCode the policy's max_model_len
    max_tokens: int = 4096  # OpenCode sends it as max_tokens on every request
    compaction: bool = False  # auto-compaction and pruning of old tool outputs: both rewrite the history
    skip_plugin_install: bool = True
    config: Mapping[str, object] = field(default_factory=dict)  # merged (top level) over the generated config
    extra_args: tuple[str, ...] = ()  # after `run -m P/M`, e.g. ("--print-logs",)

    def __post_init__(self) -> None:
        check_provider(self.provider, context_window=self.context_window, max_tokens=self.max_tokens)

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
            "compaction": {"auto": self.compaction, "prune": self.compaction},
            "provider": {
                self.provider: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Interceptor",
                    "options": {"baseURL": rollout.base_url, "apiKey": rollout.secret},
                    "models": {
                        rollout.model: {
                            "name": rollout.model,
                            "limit": {"context": self.context_window, "output": self.max_tokens},
                        }
                    },
                }
            },
            **self.config,
        }
        written = [write_private_json(xdg["XDG_CONFIG_HOME"] / "interceptor" / "opencode.json", config)]
        if self.skip_plugin_install:
            written += _mark_plugin_installed(xdg["XDG_CONFIG_HOME"] / "opencode")
        env = {
            "HOME": str(home),
            **{key: str(path) for key, path in xdg.items()},
            "OPENCODE_CONFIG": str(written[0]),
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
            files_written=tuple(written),
            secrets=(rollout.secret,),
            host_paths=program_paths(binary),
        )


def _mark_plugin_installed(config_dir: Path) -> list[Path]:
    """OpenCode skips its dependency install in a directory whose node_modules exists and whose lock file's root
    already lists every wanted package (checked against 1.18.33's `Npm.install`)."""
    (config_dir / "node_modules").mkdir(parents=True, exist_ok=True)
    lock = write_private_json(
        config_dir / "package-lock.json",
        {"lockfileVersion": 3, "packages": {"": {"dependencies": {_PLUGIN_PACKAGE: OPENCODE.version}}}},
    )
    return [lock]
