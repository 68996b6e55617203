#!/usr/bin/env bash
# Set up the project venv, then run the main job on the embedded default: a tiny Qwen3 model built offline, served
# by the local CPU engine, behind the interception server. Extra arguments go to `interceptor demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/interceptor demo "$@"
