#!/usr/bin/env bash
# The whole recipe for one task family and one seed: import SmolLM2-135M-Instruct, generate the family's splits,
# evaluate the imported model on the held-out split, train it with GRPO through the agent, evaluate the trained
# policy, and write one report.
#
#   examples/train_smollm2_cpu/run.sh submit 1            # family, seed; RUN = runs/smollm2/submit-seed1
#   K=4 HELD_OUT=50 STEPS=4 examples/train_smollm2_cpu/run.sh submit 2
#   SERVE=vllm examples/train_smollm2_cpu/run.sh submit 2   # the policy served by vLLM (scripts/setup-vllm.sh)
#   WARM_START=16 examples/train_smollm2_cpu/run.sh add 1   # a supervised warm-start on 16 worked solutions first
#
# Run again, it keeps what does not change: the imported model, the warm-started one and their evaluations
# (`before`, `warm-start` in RUN/eval/eval.json); training (its RUN/train removed first) and the `after` evaluation
# run again.
#
# With WARM_START=N (for a family the imported model cannot start on: GRPO has no signal at 0%) the imported model is
# fine-tuned on N of the training split's worked solutions (`interceptor warm-start`, TRL SFT on the agent's turns),
# evaluated as `warm-start`, and GRPO starts from it; `before` is still the imported model. WARM_SET passes options
# to warm-start (WARM_SET="--learning-rate 1e-5").
#
# With SERVE=vllm the model is imported with untied embeddings (vLLM 0.31 reloads a tied output head wrong), a vLLM
# server with its dev endpoints serves it during training (weights reloaded into it after every step), and after
# training the run's records are rescored against vLLM serving the imported weights (`rescore.txt`). Evaluations use
# the local engine either way, so runs on either server are measured alike.
#
# Any other `interceptor train` key can be changed in FAMILY.toml beside this script or with SET="--set key=value".
set -euo pipefail
cd "$(dirname "$0")/../.."
family=${1:?usage: run.sh FAMILY SEED}
seed=${2:?usage: run.sh FAMILY SEED}
config=examples/train_smollm2_cpu/$family.toml
root=runs/smollm2
serve=${SERVE:-local}
bin=.venv/bin
[ -f "$config" ] || { echo "no recipe for $family: $config" >&2; exit 2; }
case "$serve" in
  local) model=$root/model run=$root/$family-seed$seed
         [ -f "$model/config.json" ] || "$bin/interceptor" make-model smollm2 "$model" ;;
  vllm) model=$root/model-untied run=$root/$family-seed$seed-vllm
        [ -f "$model/config.json" ] || "$bin/interceptor" make-model smollm2 "$model" --untie-embeddings ;;
  *) echo "SERVE must be local or vllm, not $serve" >&2; exit 2 ;;
esac

vllm_pid=
start_vllm() {  # MODEL_DIR LOG: a vLLM server on a free port with the dev endpoints; sets upstream
    local python=${INTERCEPTOR_VLLM_VENV:-$HOME/.cache/interceptor/vllm-venv}/bin/python port
    [ -x "$python" ] || { echo "no vLLM venv at $python: run scripts/setup-vllm.sh" >&2; exit 2; }
    port=$("$bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    upstream=http://127.0.0.1:$port
    VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        setsid env -u PYTHONPATH -u VIRTUAL_ENV "$python" -m vllm.entrypoints.openai.api_server --model "$1" \
        --dtype float32 --enforce-eager --host 127.0.0.1 --port "$port" >"$2" 2>&1 &
    vllm_pid=$!
    until curl -sf "$upstream/health" >/dev/null; do
        kill -0 "$vllm_pid" 2>/dev/null || { tail -20 "$2" >&2; echo "vLLM exited; log: $2" >&2; exit 1; }
        sleep 2
    done
    echo "vLLM serves $1 at $upstream (log: $2)"
}
stop_vllm() { [ -z "$vllm_pid" ] || { kill -TERM -- "-$vllm_pid" 2>/dev/null || true; wait "$vllm_pid" || true; vllm_pid=; }; }
trap stop_vllm EXIT
"$bin/interceptor" make-tasks "$family" "$run/tasks" --seed "$seed" --train "${TRAIN:-200}" --held-out "${HELD_OUT:-50}"
agent="python examples/agents/simple_agent.py --shots $run/tasks/shots.json --max-turns 3 --max-tokens 48"
# shellcheck disable=SC2086  # SET is word-split on purpose: several --set options
sets=(--set "tasks=\"$run/tasks/train.jsonl\"" --set "out=\"$run/train\"" --set "command=\"$agent\""
      --set "seed=$seed" --set "max_steps=${STEPS:-4}" ${SET:-})
evaluate() {  # label model
    "$bin/interceptor" evaluate --config "$config" "${sets[@]}" --set "model=\"$2\"" \
        --tasks "$run/tasks/held_out.jsonl" --model "$2" --label "$1" -k "${K:-4}" --out "$run/eval" \
        --set 'upstream="local"'
}
measured() {  # label: already in eval.json (its model does not change between runs of this script)
    [ -f "$run/eval/eval.json" ] && "$bin/python" -c 'import json, sys
sys.exit(0 if any(e["label"] == sys.argv[2] for e in json.load(open(sys.argv[1]))) else 1)' "$run/eval/eval.json" "$1"
}
[ -n "${SKIP_BEFORE:-}" ] || measured before || evaluate before "$model"
if [ -n "${WARM_START:-}" ]; then
    "$bin/python" examples/agents/simple_agent.py --shots "$run/tasks/shots.json" --print-prefix >"$run/tasks/prefix.json"
    # shellcheck disable=SC2086  # WARM_SET is word-split on purpose
    [ -f "$run/warm/config.json" ] || "$bin/interceptor" warm-start "$model" "$run/warm" \
        --gold "$run/tasks/train_gold.jsonl" --prefix "$run/tasks/prefix.json" --transcripts "$WARM_START" ${WARM_SET:-}
    measured warm-start || evaluate warm-start "$run/warm"
    model=$run/warm
fi
sets+=(--set "model=\"$model\"")
rm -rf "$run/train"  # records append: a run again starts from the model, so its records start empty too
if [ "$serve" = vllm ]; then
    mkdir -p "$run"
    start_vllm "$model" "$run/vllm-train.log"
    "$bin/interceptor" train --config "$config" "${sets[@]}" --set "upstream=\"$upstream\""
    stop_vllm
    # Version 1 is the imported weights (the first sync, before any step, publishes them unchanged).
    start_vllm "$model" "$run/vllm-rescore.log"
    "$bin/interceptor" rescore "$run/train/rollouts.jsonl" --upstream "$upstream" --policy-version 1 \
        --json "$run/rescore.json" | tee "$run/rescore.txt"
    stop_vllm
else
    "$bin/interceptor" train --config "$config" "${sets[@]}"
fi
evaluate after "$run/train/final"
"$bin/python" examples/train_smollm2_cpu/report.py "$run"
