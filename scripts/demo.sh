#!/usr/bin/env bash
# Set up, then run the main job on the embedded default: Pi rollouts on the example tasks, through the interception
# server, against the tiny model served by the local CPU engine (built offline on first use), graded on the host.
# Each rollout runs in its own namespaces (bubblewrap) where this machine allows it, else as this user.
# Then a short GRPO run on the same model (examples/demo/train.toml): rewards per step as they come, weights into
# the engine after each step, and the viewer's address at the end.
# Extra arguments go to `interceptor run` (e.g. `-n 4`, `--agent opencode`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-agents.sh pi
bash scripts/setup-sandbox.sh || echo "[demo] no bubblewrap: rollouts run without isolation (LocalSandbox)"
.venv/bin/interceptor run --agent pi --tasks examples/tasks/arithmetic.jsonl --upstream local \
  --model runs/model -n 2 --concurrency 2 --max-tokens 96 --out runs/demo "$@"
echo
echo "[demo] GRPO on the same policy: an OpenAI-SDK agent on the submit family, 4 steps (examples/demo/train.toml)"
.venv/bin/interceptor make-tasks submit runs/demo-train/tasks --seed 0 --train 64 --held-out 16
.venv/bin/interceptor train --config examples/demo/train.toml
echo
echo "[demo] look at what the policy did: .venv/bin/interceptor view runs/demo-train  (http://127.0.0.1:8600/)"
