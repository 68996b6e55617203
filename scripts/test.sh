#!/usr/bin/env bash
# Set up everything the tests need, then run them: the project venv, the CPU vLLM venv (tests/e2e start a real
# vLLM from it), the pinned Pi and OpenCode from npm (tests/e2e run them), bubblewrap (the namespace sandbox),
# Chromium (the viewer's browser tests) and, where a daemon can run, Docker with an offline-built Debian image (the
# Docker sandbox) and Harbor in its own Python 3.12 venv with its boxes' agents (the Harbor driver). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/setup.sh
bash scripts/setup-vllm.sh
bash scripts/setup-agents.sh
bash scripts/setup-browser.sh || echo "[test] no Chromium: the viewer's browser tests will skip"
bash scripts/setup-sandbox.sh || echo "[test] no bubblewrap: the namespace sandbox tests will skip and rollouts fall back to LocalSandbox"
timeout 900 bash scripts/setup-docker.sh || echo "[test] no Docker daemon here: the Docker sandbox tests will skip"
timeout 900 bash scripts/setup-harbor.sh || echo "[test] no Harbor here: the Harbor driver tests will skip"
echo "[test] set-up took $((SECONDS - started))s"
exec .venv/bin/python -m pytest "$@"
