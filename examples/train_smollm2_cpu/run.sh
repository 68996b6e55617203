#!/usr/bin/env bash
# The whole recipe for one task family and one seed: import SmolLM2-135M-Instruct, generate the family's splits,
# evaluate the imported model on the held-out split, train it with GRPO through the agent, evaluate the trained
# policy, and write one report.
#
#   examples/train_smollm2_cpu/run.sh submit 1            # family, seed; RUN = runs/smollm2/submit-seed1
#   K=4 HELD_OUT=50 STEPS=4 examples/train_smollm2_cpu/run.sh submit 2
#
# Any other `interceptor train` key can be changed in FAMILY.toml beside this script or with SET="--set key=value".
set -euo pipefail
cd "$(dirname "$0")/../.."
family=${1:?usage: run.sh FAMILY SEED}
seed=${2:?usage: run.sh FAMILY SEED}
config=examples/train_smollm2_cpu/$family.toml
root=runs/smollm2
run=$root/$family-seed$seed
bin=.venv/bin
[ -f "$config" ] || { echo "no recipe for $family: $config" >&2; exit 2; }

[ -f "$root/model/config.json" ] || "$bin/interceptor" make-model smollm2 "$root/model"
"$bin/interceptor" make-tasks "$family" "$run/tasks" --seed "$seed" --train "${TRAIN:-200}" --held-out "${HELD_OUT:-50}"
agent="python examples/agents/simple_agent.py --shots $run/tasks/shots.json --max-turns 3 --max-tokens 48"
# shellcheck disable=SC2086  # SET is word-split on purpose: several --set options
sets=(--set "model=\"$root/model\"" --set "tasks=\"$run/tasks/train.jsonl\"" --set "out=\"$run/train\""
      --set "command=\"$agent\"" --set "seed=$seed" --set "max_steps=${STEPS:-4}" ${SET:-})
evaluate() {  # label model
    "$bin/interceptor" evaluate --config "$config" "${sets[@]}" --tasks "$run/tasks/held_out.jsonl" \
        --model "$2" --label "$1" -k "${K:-4}" --out "$run/eval"
}
[ -n "${SKIP_BEFORE:-}" ] || evaluate before "$root/model"
"$bin/interceptor" train --config "$config" "${sets[@]}"
evaluate after "$run/train/final"
"$bin/python" examples/train_smollm2_cpu/report.py "$run"
