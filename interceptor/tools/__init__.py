"""Tools over recorded rollouts: `inspect` summarises a record file, `rescore` measures a policy server's logprobs
against the recorded ones, `replay_upstream` answers from a recorded rollout with the policy server's contract.
"""
