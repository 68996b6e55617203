"""The gate (`interception_gate` mode): each turn generated on the policy server from token ids, and recorded.

`turn` plans one turn's prompt, generates upstream, records and answers; `trajectory` matches each request against
what was recorded (extend the sample, or fork a new one: never a splice); `branch_record` holds one branch's tokens
until its rollout finishes.
"""
