"""The RL trainer proper: TRL's `AsyncGRPOTrainer` fed by real agents through the interceptor.

`worker` is the rollout worker TRL pulls samples from (groups, staleness, backpressure); `advantages` turns a
group's finished rollouts into TRL samples; `weight_sync` publishes the trainer's weights to the policy server;
`grpo_setup` wires the policy stack to TRL; `trl_compat` is what TRL needs on this machine; `precision` keeps the
trainer's precision and the generator's in step; `logprob_gap` measures them apart every step. `environment`,
`environment_host` and `environment_tools` are the other bridge: this project's tasks and sandboxes as TRL
`environment_factory` environments.
"""
