"""Agent specs: given one rollout, write an unmodified agent's config files and say how to start it.

`spec` says what a spec is; `pi`, `opencode`, `claude`, `codex`, `mini_swe` and `command` (any OpenAI-API program)
are the specs; `registry` is the one table every command reads them from; `packages` pins their npm and PyPI
packages and `install` installs them.
"""
