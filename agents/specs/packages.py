"""The pinned npm packages of the supported agents, and where their programs are found.

An agent is installed with `npm install --prefix <agents dir>/<name>-<version> <package>@<version>` (see
`agents.specs.install`), which leaves the program at `<prefix>/node_modules/.bin/<bin>` and a stamp file once the
installed program has reported the pinned version. The agents dir is `$INTERCEPTOR_AGENTS_DIR`, by default
`~/.cache/interceptor/agents` (this module is the one place that reads that variable).

`find_binary` looks, in order: an explicit path the spec was given, the pinned install, then PATH. A program found on
PATH may be another version than the pin; the pins are what the tests verified.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agents.errors import AgentConfigError, AgentNotInstalled

__all__ = ["CLAUDE", "CODEX", "OPENCODE", "PACKAGES", "PI", "AgentPackage", "agents_dir", "find_binary", "installed_binary"]

STAMP = ".interceptor-installed"  # written into the prefix after the installed program reported its version


@dataclass(frozen=True, kw_only=True)
class AgentPackage:
    name: str  # what `interceptor agents install NAME` takes
    npm: str  # the npm package
    version: str  # the pinned version
    bin: str  # the program the package puts in node_modules/.bin

    @property
    def spec(self) -> str:
        return f"{self.npm}@{self.version}"

    def prefix(self, root: Path | None = None) -> Path:
        return (root or agents_dir()) / f"{self.name}-{self.version}"


PI = AgentPackage(name="pi", npm="@mariozechner/pi-coding-agent", version="0.73.1", bin="pi")
# A native binary (Bun-compiled), shipped in a per-platform optional dependency (opencode-linux-x64, ...).
OPENCODE = AgentPackage(name="opencode", npm="opencode-ai", version="1.18.33", bin="opencode")
# A native binary in a per-platform optional dependency; speaks the Anthropic Messages API only.
CLAUDE = AgentPackage(name="claude", npm="@anthropic-ai/claude-code", version="2.1.330", bin="claude")
# A native (Rust) binary in a per-platform optional dependency; speaks the OpenAI Responses API only.
CODEX = AgentPackage(name="codex", npm="@openai/codex", version="0.169.0", bin="codex")
PACKAGES: dict[str, AgentPackage] = {package.name: package for package in (PI, OPENCODE, CLAUDE, CODEX)}


def agents_dir() -> Path:
    configured = os.environ.get("INTERCEPTOR_AGENTS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "interceptor" / "agents"


def installed_binary(package: AgentPackage, root: Path | None = None) -> Path | None:
    """The pinned install's program, if a finished install is there."""
    prefix = package.prefix(root)
    binary = prefix / "node_modules" / ".bin" / package.bin
    stamp = prefix / STAMP
    if stamp.is_file() and stamp.read_text().strip() == package.version and os.access(binary, os.X_OK):
        return binary
    return None


def find_binary(package: AgentPackage, explicit: Path | None = None, *, root: Path | None = None) -> Path:
    if explicit is not None:
        if not os.access(explicit, os.X_OK):
            raise AgentConfigError(f"{package.name}: {explicit} is not an executable file")
        return explicit
    installed = installed_binary(package, root)
    if installed is not None:
        return installed
    on_path = shutil.which(package.bin)
    if on_path is not None:
        return Path(on_path)
    raise AgentNotInstalled(
        f"{package.name} is not installed: run `interceptor agents install {package.name}` (installs {package.spec} "
        f"into {package.prefix(root)}; needs Node.js >= 20 and npm), or put `{package.bin}` on PATH"
    )
