#!/bin/bash
# Harbor's contract: run after the agent, in its workdir, with these files at /tests; the reward goes to
# /logs/verifier/reward.txt. The checks run from /tests, so nothing the agent left in /app defines them.
cd /app
if python3 /tests/check_calc.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
