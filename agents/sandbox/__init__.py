"""Sandboxes: where one rollout's agent runs, with limits, reaching nothing but its model endpoint.

`contract` defines the sandbox, `base` the unisolated backend; `namespace` (bubblewrap) and `docker` (a container,
bound to this host's files or, `docker.remote`, not) are the isolating backends, sharing `bridged` (their one way
out, `netbridge`, carried over a pipe by `stdiomux` where no socket can be bound); `supervision` watches a started
agent, `proctree` ends its process tree, `cgroups` limits it, `output` keeps its output's tail; `pool` and `spare`
warm sandboxes ahead; `breaker` stops burning rollouts on a broken backend.
"""
