"""What an agent spec is: given one rollout, say which config files the agent needs and how to start it.

    launch = PiAgent().prepare(AgentRollout(base_url=..., secret=..., model="policy",
                                            workspace=box.workspace, home=box.home, instruction="..."))
    result = await box.run(launch, limits=RunLimits(wall_s=900, idle_s=120), activity=heartbeat)

Contract of every spec:
- `prepare` writes nothing: it returns an `AgentLaunch` whose `files` (`BoxFile`: a path inside `rollout.home`, its
  bytes and mode, or a directory) the sandbox writes into the box before it starts the agent, by whatever way
  files reach that box (`write_box_files` for a box that shares this host's file system).
- The secret never appears in `argv` (invariant 4 of DESIGN.md; checked here). Agents that read their provider
  key from a config file get it there, in a file of mode 0600, and not in the environment, so the programs the agent
  spawns (its shell tool) do not inherit it. (They run as the same user and could still read the file: only a
  container sandbox with another user closes that.)
- The environment is complete for the agent's own needs (HOME and its config variables); the sandbox adds only the
  basics it passes through from the host (PATH, locale) and TMPDIR. Nothing else of the host's environment (API
  keys, tokens) reaches the agent.
- The instruction goes on stdin when the agent reads it from there, so no quoting or argv parsing can alter it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from agents.errors import AgentConfigError

__all__ = ["AgentLaunch", "AgentRollout", "AgentSpec", "Bind", "BoxFile", "check_provider", "private_json",
           "program_paths", "write_box_files", "write_private_json"]

# A bearer token's characters (RFC 6750). Anything else could be read as syntax by an agent's config loader:
# Pi runs a value starting with "!" as a shell command and OpenCode substitutes "{env:...}".
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")


@dataclass(frozen=True, kw_only=True)
class AgentRollout:
    """Everything an agent spec needs to know about one rollout."""

    base_url: str  # http://HOST:PORT/rollout/<id>/v1
    secret: str = field(repr=False)  # the rollout's bearer secret; opens this rollout only
    model: str  # the model name the server serves (ServerConfig.served_model_name)
    workspace: Path  # the agent's working directory: the task's files
    home: Path  # the agent's own HOME; its config files go here
    instruction: str

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise AgentConfigError(f"base_url must be http(s): {self.base_url!r}")
        if not _TOKEN.fullmatch(self.secret):
            raise AgentConfigError("the rollout secret must be a non-empty bearer token (A-Z a-z 0-9 . _ ~ + / = -)")
        if not self.model or self.model.strip() != self.model:
            raise AgentConfigError(f"model must be a non-empty name without surrounding spaces: {self.model!r}")
        if not self.instruction.strip():
            raise AgentConfigError("the instruction is empty")
        for name in ("workspace", "home"):
            if not getattr(self, name).is_absolute():
                raise AgentConfigError(f"{name} must be an absolute path: {getattr(self, name)}")


@dataclass(frozen=True)
class BoxFile:
    """One file (or, with no data, a directory) the sandbox makes in the box before the agent starts; parents are
    made 0700."""

    path: Path  # absolute, inside the rollout's directory
    data: bytes | None = field(default=None, repr=False)  # None: a directory
    mode: int = 0o600

    def __post_init__(self) -> None:
        if not self.path.is_absolute() or ".." in self.path.parts:
            raise AgentConfigError(f"a box file's path must be absolute and plain: {self.path}")
        if not 0 <= self.mode <= 0o777:
            raise AgentConfigError(f"mode must be permission bits: {oct(self.mode)}")


@dataclass(frozen=True)
class Bind:
    """A host directory or file shown at a path of the box's own choosing (a task's hidden tests at `/tests` while
    a verifier runs, a writable `/logs/verifier` it leaves its reward in). Only backends with a file system of their
    own can (namespace, Docker); the others refuse a launch that asks."""

    source: Path  # on the host, absolute
    target: str  # in the box, absolute
    writable: bool = False

    def __post_init__(self) -> None:
        if not self.source.is_absolute() or not self.target.startswith("/") or ".." in Path(self.target).parts:
            raise AgentConfigError(f"a bind joins two absolute paths: {self.source} -> {self.target}")
        if Path(self.target) in (Path("/"), Path("/proc"), Path("/dev"), Path("/tmp")):
            raise AgentConfigError(f"a bind cannot replace the box's {self.target}")


@dataclass(frozen=True, kw_only=True)
class AgentLaunch:
    """How to start the agent: what a sandbox needs, and nothing host-specific."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)  # may hold the secret (the command agent); shown by key only
    cwd: Path
    stdin: bytes | None = field(default=None, repr=False)  # written to the agent's stdin, which is then closed
    files: tuple[BoxFile, ...] = ()  # written into the box by the sandbox, before the agent starts
    secrets: tuple[str, ...] = field(default=(), repr=False)  # scrubbed from whatever the sandbox keeps
    # Host files and directories the program runs from (its install, its interpreter). A backend that does not
    # share the host's file system (a container) mounts them read-only at the same paths.
    host_paths: tuple[Path, ...] = ()
    binds: tuple[Bind, ...] = ()  # host paths shown at other paths in the box (set-up and graders ask for them)

    def __post_init__(self) -> None:
        if not self.argv:
            raise AgentConfigError("argv is empty")
        for secret in self.secrets:
            if any(secret in arg for arg in self.argv):
                raise AgentConfigError("a secret is in argv, where every user of the machine can read it")

    def __repr__(self) -> str:
        return f"AgentLaunch(argv={self.argv!r}, env_keys={sorted(self.env)!r}, cwd={str(self.cwd)!r})"

    @property
    def files_written(self) -> tuple[Path, ...]:
        """The paths of the files (not directories) the sandbox writes for this launch."""
        return tuple(f.path for f in self.files if f.data is not None)


@runtime_checkable
class AgentSpec(Protocol):
    """A frozen description of how to run one kind of agent; `prepare` is called once per rollout."""

    @property
    def name(self) -> str: ...

    def prepare(self, rollout: AgentRollout) -> AgentLaunch: ...


def program_paths(*programs: str | Path) -> tuple[Path, ...]:
    """What running these programs takes from the host: each one's resolved file (for an npm install, the whole
    install: the directory holding its `node_modules`), the Node interpreter a JavaScript entry point needs, and for
    a Python interpreter (the program, or the one its shebang names) its installation and the venv it is in."""
    paths: list[Path] = []
    for program in programs:
        found = shutil.which(str(program))
        if found is None:
            continue
        resolved = Path(found).resolve()
        parts = Path(found).absolute().parts
        if "node_modules" in parts:
            paths.append(Path(*parts[: parts.index("node_modules")]).resolve())
        paths.append(resolved)
        shebang = _shebang(resolved)  # None: not a script
        if resolved.suffix in (".js", ".mjs", ".cjs") or any("node" in word for word in shebang or ()):
            node = shutil.which("node")
            if node is not None:
                paths.append(Path(node).resolve())
        if shebang is None:
            python = Path(found).absolute() if resolved.name.startswith("python") else None
        else:
            python = _python_named(shebang)
        if python is not None:
            paths += _python_paths(python)
    return tuple(dict.fromkeys(paths))


def _python_paths(python: Path) -> list[Path]:
    """A Python interpreter's venv (where `python` is one's `bin/python`) and its installation (`<prefix>/bin/
    pythonX.Y` -> `<prefix>`); not the system's `/usr`, which is the box's own."""
    paths = []
    if (python.parent.parent / "pyvenv.cfg").is_file():
        paths.append(python.parent.parent.resolve())
    prefix = python.resolve().parent.parent
    if prefix not in (Path("/usr"), Path("/")):
        paths.append(prefix)
    return paths


def _shebang(path: Path) -> list[str] | None:
    """The words of a script's `#!` line, or None for a file that is not a script (or cannot be read)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(200).decode(errors="replace")
    except OSError:
        return None
    return first.removeprefix("#!").split() if first.startswith("#!") else None


def _python_named(shebang: list[str]) -> Path | None:
    """The Python interpreter a shebang names (`#!/path/python` or `#!/usr/bin/env python3`), if any."""
    words = shebang[1:] if shebang and Path(shebang[0]).name == "env" else shebang
    if not words or not Path(words[0]).name.startswith("python"):
        return None
    found = shutil.which(words[0])
    return Path(found).absolute() if found else None


def check_provider(provider: str, *, context_window: int, max_tokens: int) -> None:
    """The provider settings every agent config shares: a provider name usable in `P/M`, and sane token limits."""
    if not provider or "/" in provider:
        raise AgentConfigError(f"provider must be a name without '/': {provider!r}")
    if context_window < 1 or not 0 < max_tokens <= context_window:
        raise AgentConfigError("need 0 < max_tokens <= context_window")


def private_json(path: Path, data: object) -> BoxFile:
    """`data` as a JSON file readable by the owner only (0600)."""
    return BoxFile(path, (json.dumps(data, indent=2) + "\n").encode(), 0o600)


def write_box_files(files: tuple[BoxFile, ...], root: Path) -> None:
    """Write `files` through this host's file system, each inside `root` (the rollout's directory; refused
    otherwise, symbolic links included), parents 0700, each with exactly its mode (also over a file already there)."""
    root = root.resolve()
    for box_file in files:
        parent = box_file.path.parent if box_file.data is not None else box_file.path
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not parent.resolve().is_relative_to(root):
            raise AgentConfigError(f"{box_file.path} is outside the rollout's directory {root}")
        if box_file.data is None:
            os.chmod(box_file.path, box_file.mode)
            continue
        fd = os.open(box_file.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, box_file.mode)
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), box_file.mode)  # the mode argument does not apply to a file that existed
            file.write(box_file.data)


def write_private_json(path: Path, data: object) -> Path:
    """Write `data` as JSON readable by the owner only (0600), creating parent directories (0700)."""
    write_box_files((private_json(path, data),), path.parent)
    return path
