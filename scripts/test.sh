#!/usr/bin/env bash
# Set up everything the tests need, then run them: the project venv, the CPU vLLM venv (tests/e2e start a real
# vLLM from it). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
bash scripts/setup-vllm.sh
echo "[test] set-up took $((SECONDS - started))s"
exec .venv/bin/python -m pytest "$@"
