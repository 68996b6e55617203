#!/usr/bin/env bash
# Create the virtual environments that bench/bench_gate.py starts the peer proxies from, and install wrk.
#
#   scripts/setup-bench.sh                 # create or repair; a no-op when the pinned versions already import
#   scripts/setup-bench.sh --force         # recreate both venvs from scratch (python -m venv --clear)
#   scripts/setup-bench.sh --no-litellm    # verifiers only
#
# Where: bench/.venv-peers (verifiers) and bench/.venv-litellm (LiteLLM's proxy), each kept out of git by the
# `.gitignore` this script writes inside it; from ${INTERCEPTOR_BENCH_PYTHON:-python3}. The peers live apart from
# the project's .venv because they pin their own openai, pydantic and aiohttp versions, and apart from each other
# because verifiers 0.4.0 and litellm[proxy] have no common resolution.
set -euo pipefail

VERIFIERS_VERSION=0.4.0
LITELLM_VERSION=1.106.2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${INTERCEPTOR_BENCH_PYTHON:-python3}"

force=0
litellm=1
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --no-litellm) litellm=0 ;;
    *) echo "usage: $0 [--force] [--no-litellm]" >&2; exit 2 ;;
  esac
done

started=$SECONDS
step() { echo "[setup-bench +$((SECONDS - started))s] $*"; }

# venv DIR CHECK REQUIREMENT...: create DIR unless CHECK (python code) already passes in it, then install.
venv() {
  local dir="$1" check="$2"
  shift 2
  if [ "$force" = 0 ] && [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" 2>/dev/null; then
    step "$(basename "$dir") already has $*"
    return
  fi
  step "creating $dir"
  if [ "$force" = 1 ]; then "$PYTHON" -m venv --clear "$dir"; else "$PYTHON" -m venv "$dir"; fi
  printf '*\n' > "$dir/.gitignore"  # the whole venv stays out of git, whatever the repository's .gitignore says
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  step "installing $*"
  "$dir/bin/python" -m pip install --quiet "$@"
  "$dir/bin/python" -c "$check" || { echo "$dir does not import what it should" >&2; exit 1; }
}

venv "$ROOT/bench/.venv-peers" \
  "import importlib.metadata as m, verifiers.v1.interception; assert m.version('verifiers') == '$VERIFIERS_VERSION'" \
  "verifiers==$VERIFIERS_VERSION"
if [ "$litellm" = 1 ]; then
  venv "$ROOT/bench/.venv-litellm" \
    "import importlib.metadata as m, litellm.proxy; assert m.version('litellm') == '$LITELLM_VERSION'" \
    "litellm[proxy]==$LITELLM_VERSION"
fi

if ! command -v wrk >/dev/null 2>&1; then
  step "installing wrk (optional, for fixed-body load; bench_gate.py does not need it)"
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; } || echo "wrk could not be installed" >&2
  else
    echo "wrk is missing and apt-get is not usable here" >&2
  fi
fi
step "done"
