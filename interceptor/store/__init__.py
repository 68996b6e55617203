"""The store: what a rollout leaves behind and how it survives a crash.

`records` defines each record type once; `recorder` appends finished rollouts to a JSON Lines file (fsynced before
they are reported), `journal` writes live rollouts ahead so a `kill -9` loses at most the turns in flight,
`trace_log` keeps a live rollout's trace, `record_lock` allows one server per record file.
"""
