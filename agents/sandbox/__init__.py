"""Sandboxes: where one rollout's agent runs, with limits, reaching nothing but its model endpoint.

`base` defines the sandbox and the unisolated backend; `namespace` (bubblewrap) and `docker` are the isolating
backends, sharing `bridged` (their one way out, `netbridge`); `supervision` watches a started agent, `proctree`
ends its process tree, `cgroups` limits it, `output` keeps its output's tail; `pool` and `spare` warm sandboxes
ahead; `breaker` stops burning rollouts on a broken backend.
"""
