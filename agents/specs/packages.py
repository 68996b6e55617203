"""The pinned packages of the supported agents (npm or PyPI), and where their programs are found.

An npm agent is installed with `npm install --prefix <agents dir>/<name>-<version> <package>@<version>` (see
`agents.specs.install`), which leaves the program at `<prefix>/node_modules/.bin/<bin>`; a PyPI agent into a virtual
environment of its own, `<prefix>/venv`, whose interpreter is its program (`python -I -m <module>`: a venv's
interpreter works from wherever the venv is, its console scripts do not). A stamp file marks an install once the
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
from typing import Literal

from agents.errors import AgentConfigError, AgentNotInstalled

__all__ = ["CLAUDE", "CODEX", "MINI_SWE", "OPENCODE", "PACKAGES", "PI", "AgentPackage", "agents_dir", "find_binary",
           "installed_binary"]

_NEEDS = {"npm": "needs Node.js >= 20 and npm", "pypi": "needs Python >= 3.10 and the package index"}
STAMP = ".interceptor-installed"  # written into the prefix after the installed program reported its version


@dataclass(frozen=True, kw_only=True)
class AgentPackage:
    name: str  # what `interceptor agents install NAME` takes
    package: str  # its name on the registry
    version: str  # the pinned version
    bin: str  # the program the package installs (npm: in node_modules/.bin; PyPI: its console script, on PATH)
    registry: Literal["npm", "pypi"] = "npm"
    module: str | None = None  # PyPI: what the venv's interpreter runs (`python -I -m MODULE`)
    env: tuple[tuple[str, str], ...] = ()  # what the program needs to start unattended and offline

    def __post_init__(self) -> None:
        if self.registry not in ("npm", "pypi"):
            raise AgentConfigError(f"{self.name}: registry must be npm or pypi, not {self.registry!r}")
        if (self.registry == "pypi") != (self.module is not None):
            raise AgentConfigError(f"{self.name}: a PyPI agent names the module it runs, an npm one does not")

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"

    def prefix(self, root: Path | None = None) -> Path:
        return (root or agents_dir()) / f"{self.name}-{self.version}"

    def program(self, prefix: Path) -> Path:
        """Where an install into `prefix` leaves the program."""
        if self.registry == "pypi":
            return prefix / "venv" / "bin" / "python"
        return prefix / "node_modules" / ".bin" / self.bin

    def command(self, binary: Path) -> tuple[str, ...]:
        """The argv that starts the agent from `binary`: a PyPI agent's interpreter runs its module isolated (no
        PYTHON* variables, no user site, not the working directory on sys.path: a workspace file cannot shadow a
        module); its console script, or an npm program, runs as it is."""
        if self.module is not None and binary.name.startswith("python"):
            return (str(binary), "-I", "-m", self.module)
        return (str(binary),)


PI = AgentPackage(name="pi", package="@mariozechner/pi-coding-agent", version="0.73.1", bin="pi")
# A native binary (Bun-compiled), shipped in a per-platform optional dependency (opencode-linux-x64, ...).
OPENCODE = AgentPackage(name="opencode", package="opencode-ai", version="1.18.33", bin="opencode")
# A native binary in a per-platform optional dependency; speaks the Anthropic Messages API only.
CLAUDE = AgentPackage(name="claude", package="@anthropic-ai/claude-code", version="2.1.330", bin="claude")
# A native (Rust) binary in a per-platform optional dependency; speaks the OpenAI Responses API only.
CODEX = AgentPackage(name="codex", package="@openai/codex", version="0.169.0", bin="codex")
# Python (litellm underneath): about 725 MB installed, most of it litellm's dependencies.
# MSWEA_CONFIGURED skips its first-run set-up prompt; LITELLM_LOCAL_MODEL_COST_MAP keeps litellm from fetching its
# model cost map from GitHub as it is imported (seen: a CONNECT to raw.githubusercontent.com, retried, then the
# bundled copy).
MINI_SWE = AgentPackage(name="mini-swe-agent", package="mini-swe-agent", version="2.4.6", bin="mini", registry="pypi",
                        module="minisweagent", env=(("MSWEA_CONFIGURED", "true"), ("MSWEA_SILENT_STARTUP", "1"),
                                                    ("LITELLM_LOCAL_MODEL_COST_MAP", "True")))
PACKAGES: dict[str, AgentPackage] = {package.name: package for package in (PI, OPENCODE, CLAUDE, CODEX, MINI_SWE)}


def agents_dir() -> Path:
    configured = os.environ.get("INTERCEPTOR_AGENTS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "interceptor" / "agents"


def installed_binary(package: AgentPackage, root: Path | None = None) -> Path | None:
    """The pinned install's program, if a finished install is there."""
    prefix = package.prefix(root)
    binary = package.program(prefix)
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
        f"into {package.prefix(root)}; {_NEEDS[package.registry]}), or put `{package.bin}` on PATH"
    )
