#!/usr/bin/env bash
# Set up, then run the main job on the embedded default: Pi rollouts on the example tasks, through the interception
# server, against the tiny model served by the local CPU engine (built offline on first use), graded on the host.
# Each rollout runs in its own namespaces (bubblewrap) where this machine allows it, else as this user.
# Extra arguments go to `interceptor run` (e.g. `-n 4`, `--agent opencode`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-agents.sh pi
bash scripts/setup-sandbox.sh || echo "[demo] no bubblewrap: rollouts run without isolation (LocalSandbox)"
exec .venv/bin/interceptor run --agent pi --tasks examples/tasks/arithmetic.jsonl --upstream local \
  --model runs/model -n 2 --concurrency 2 --max-tokens 96 --out runs/demo "$@"
