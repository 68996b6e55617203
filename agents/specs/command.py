"""Any program that speaks the OpenAI chat API as an agent: people's own agents.

The program gets `OPENAI_BASE_URL`, `OPENAI_API_KEY` (the rollout's secret) and `OPENAI_MODEL` in its environment,
which is what the OpenAI SDKs read, plus its own HOME. The key has to travel in the environment here, so unlike Pi and
OpenCode every process the program spawns inherits it unless the program removes it; it opens this rollout only.

    CommandAgent(argv=("python", "my_agent.py", "--task", "{instruction}"))

In `argv`, `{instruction}`, `{workspace}` and `{model}` are replaced (nothing else is: other braces stay as they
are). The instruction is also written to stdin unless `instruction_on_stdin=False`.

`CommandAgent.from_command_line("python examples/agents/simple_agent.py --shots shots.json")` is what a command line
means on this host: `python` is this interpreter and every argument naming an existing file becomes its absolute
path, because the program runs in the rollout's workspace (inside a box that sees only what it is given).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agents.errors import AgentConfigError, AgentNotInstalled
from agents.specs.spec import AgentLaunch, AgentRollout, program_paths

__all__ = ["CommandAgent"]

_PLACEHOLDER = re.compile(r"\{(instruction|workspace|model)\}")  # one pass: an instruction may contain "{model}"
_RESERVED_ENV = frozenset({"OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "HOME"})


@dataclass(frozen=True, kw_only=True)
class CommandAgent:
    name: ClassVar[str] = "command"

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables for the program
    instruction_on_stdin: bool = True

    def __post_init__(self) -> None:
        if not self.argv or not self.argv[0]:
            raise AgentConfigError("argv needs at least the program")
        clash = _RESERVED_ENV & set(self.env)
        if clash:
            raise AgentConfigError(f"env may not set {sorted(clash)}: they are the rollout's")

    @classmethod
    def from_command_line(cls, line: str) -> CommandAgent:
        argv = shlex.split(line)
        if not argv:
            raise AgentConfigError("the command line is empty")
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return cls(argv=tuple(str(Path(a).absolute()) if Path(a).is_file() else a for a in argv))

    def prepare(self, rollout: AgentRollout) -> AgentLaunch:
        if shutil.which(self.argv[0]) is None:
            raise AgentNotInstalled(f"command agent: {self.argv[0]!r} is not an executable file or on PATH")
        values = {"instruction": rollout.instruction, "workspace": str(rollout.workspace), "model": rollout.model}
        argv = tuple(_PLACEHOLDER.sub(lambda match: values[match[1]], arg) for arg in self.argv)
        env = {
            **self.env,
            "HOME": str(rollout.home),
            "OPENAI_BASE_URL": rollout.base_url,
            "OPENAI_API_KEY": rollout.secret,
            "OPENAI_MODEL": rollout.model,
        }
        return AgentLaunch(
            argv=argv,
            env=env,
            cwd=rollout.workspace,
            stdin=rollout.instruction.encode() if self.instruction_on_stdin else None,
            secrets=(rollout.secret,),
            # the files the spec's own argv names, not what a placeholder became: an instruction naming a host file
            # (a task file) must not get that file bound into the box
            host_paths=(*program_paths(argv[0]), *_host_files(self.argv[1:])),
        )


def _host_files(args) -> tuple[Path, ...]:
    """Arguments that name a file of the host by absolute path (a script the program runs)."""
    return tuple(Path(a).resolve() for a in args if a.startswith("/") and Path(a).exists())
