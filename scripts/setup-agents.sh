#!/usr/bin/env bash
# Install the pinned agents the e2e tests and `interceptor run` use (Pi, OpenCode, Claude Code and Codex CLI from npm;
# mini-swe-agent from PyPI into a venv of its own, ~725 MB) into ${INTERCEPTOR_AGENTS_DIR:-$HOME/.cache/interceptor/agents}.
# Idempotent: pinned versions already installed are kept.
#
#   scripts/setup-agents.sh              # every packaged agent: pi, opencode, claude, codex and mini-swe-agent
#   scripts/setup-agents.sh pi           # just one
#   scripts/setup-agents.sh --force pi   # reinstall
#
# Needs Node.js >= 20 (Pi's minimum is 20.6) with npm, and the project venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
step() { echo "[setup-agents +$((SECONDS - started))s] $*"; }

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "[setup-agents] node and npm are needed (Node.js >= 20): install them first" >&2
  exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if (( node_major < 20 )); then
  echo "[setup-agents] Node.js $(node --version) is too old: Pi needs >= 20.6" >&2
  exit 1
fi

force=()
names=()
for arg in "$@"; do
  case "$arg" in
    --force) force=(--force) ;;
    *) names+=("$arg") ;;
  esac
done
# every agent with a package (agents/specs/packages.py: the one list)
(( ${#names[@]} )) || read -r -a names <<<"$(.venv/bin/python -c 'from agents.specs.packages import PACKAGES; print(*PACKAGES)')"

step "node $(node --version), npm $(npm --version); installing ${names[*]}"
.venv/bin/python -m agents.specs.install "${names[@]}" "${force[@]}"
step "done"
