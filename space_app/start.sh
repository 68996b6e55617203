#!/usr/bin/env bash
# The Space's entry point: `interceptor train` with the interception server on the one public port ($PORT, 7860 in a
# Space), which also serves
#   /view/ (and / redirects there)  the run viewer, live while the run writes (INTERCEPTOR_VIEW_TOKEN guards it)
#   /rollouts                       the admin API (on only with INTERCEPTOR_ADMIN_TOKEN, as a Bearer token)
#   /metrics, /health               Prometheus metrics (Bearer admin token when set) and health
#   /rollout/<id>/v1/...            each rollout's own endpoint (the agents run inside this container)
# When the run ends, the trained policy and the records go to the Hub if HF_TOKEN and SPACE_PUSH_REPO are set, and
# `interceptor view` keeps the run on view at the same port.
#
# Hardware (SPACE_HARDWARE=auto|cpu|gpu; auto: gpu when nvidia-smi sees one):
#   cpu  the local engine serves the embedded default (built into the image), trained with space_app/cpu.toml
#   gpu  vLLM serves SPACE_MODEL (default Qwen/Qwen3-0.6B, fetched from the Hub) in bf16 on port 8000, trained with
#        space_app/gpu.toml
# Other settings: SPACE_OUT (the run directory, default runs/space), SPACE_SET ("key=value ..." overrides of the
# config, e.g. "max_steps=2"), SPACE_KEEP_VIEWING=0 to exit when the run ends. Secrets only from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[space] $*" >&2; }
PORT="${PORT:-7860}"
OUT="${SPACE_OUT:-runs/space}"
HARDWARE="${SPACE_HARDWARE:-auto}"
INTERCEPTOR="${INTERCEPTOR:-interceptor}"
if [ "$HARDWARE" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HARDWARE=gpu; else HARDWARE=cpu; fi
fi
case "$HARDWARE" in cpu|gpu) ;; *) say "SPACE_HARDWARE must be auto, cpu or gpu, not '$HARDWARE'"; exit 2 ;; esac
[ -n "${INTERCEPTOR_ADMIN_TOKEN:-}" ] || say "INTERCEPTOR_ADMIN_TOKEN is not set: the admin API is off (add it as a Space secret)"
[ -n "${INTERCEPTOR_VIEW_TOKEN:-}" ] || say "INTERCEPTOR_VIEW_TOKEN is not set: the viewer is open to anyone who can reach the Space"

overrides=(--set "out='$OUT'" --set "host='0.0.0.0'" --set "port=$PORT" --set "view=true")
if [ -n "${SPACE_MODEL_DIR:-}" ]; then overrides+=(--set "model='$SPACE_MODEL_DIR'"); fi
for item in ${SPACE_SET:-}; do overrides+=(--set "$item"); done

vllm_pid=""
cleanup() { [ -z "$vllm_pid" ] || kill "$vllm_pid" 2>/dev/null || true; }
trap cleanup EXIT
if [ "$HARDWARE" = gpu ]; then
    model="${SPACE_MODEL:-Qwen/Qwen3-0.6B}"
    say "gpu: vLLM serves $model in bf16 on 127.0.0.1:8000"
    VLLM_SERVER_DEV_MODE=1 "${VLLM:-vllm}" serve "$model" --dtype bfloat16 --gpu-memory-utilization 0.35 \
        --max-model-len 16384 --host 127.0.0.1 --port 8000 >"${OUT%/}.vllm.log" 2>&1 &
    vllm_pid=$!
    for _ in $(seq 600); do
        curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && break
        kill -0 "$vllm_pid" 2>/dev/null || { say "vLLM exited:"; tail -20 "${OUT%/}.vllm.log" >&2; exit 1; }
        sleep 1
    done
    local_model="$("${PYTHON:-python}" -c "from huggingface_hub import snapshot_download as s; print(s('$model'))")"
    overrides+=(--set "model='$local_model'")
fi

say "$HARDWARE: training with space_app/$HARDWARE.toml; viewer, admin API and rollouts on port $PORT"
mkdir -p "$OUT"
"$INTERCEPTOR" train --config "space_app/$HARDWARE.toml" "${overrides[@]}"
cleanup
say "the run is over: $OUT"
"${PYTHON:-python}" space_app/push.py "$OUT" || say "pushing to the Hub failed (the run is kept in $OUT)"
if [ "${SPACE_KEEP_VIEWING:-1}" = 1 ]; then
    exec "$INTERCEPTOR" view "$OUT" --host 0.0.0.0 --port "$PORT" --prefix /view
fi
