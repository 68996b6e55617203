#!/bin/bash
# The reward as JSON: 1 when the greeting is exactly $EXPECTED (set by [verifier].env in task.toml).
if [ "$(cat /app/out/greeting.txt 2>/dev/null)" = "$EXPECTED" ]; then reward=1; else reward=0; fi
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
