#!/bin/bash
# The reward is the parity of the length of what the agent printed (Pi's JSON events, Harbor keeps them in
# /logs/agent): random text from a random model gives rollouts of one group different rewards.
n=$(wc -c < /logs/agent/pi.txt 2>/dev/null || echo 0)
echo $((n % 2)) > /logs/verifier/reward.txt
