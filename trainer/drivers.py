"""`--driver harbor` for `interceptor run` and `train`: the Harbor driver (`agents.harbor.driver`) from the command
line, or None for Interceptor's own boxes; its refusals are the command's error, before anything starts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from agents.errors import AgentConfigError
from agents.tasks import Task
from interceptor.server import InterceptionServer

__all__ = ["check_driver", "harbor_driver"]


def harbor_driver(args: argparse.Namespace):
    """The HarborDriver `args` ask for, or None (`--driver interceptor`); SystemExit with the reason if refused."""
    if args.driver != "harbor":
        harbor_only = [flag for flag, value in (("--harbor-trials", args.harbor_trials),
                                                ("--harbor-api-format", args.harbor_api_format),
                                                ("--harbor-env-kwarg", getattr(args, "harbor_env_kwarg", ())),
                                                ("--harbor-agent-kwarg", getattr(args, "harbor_agent_kwarg", ())),
                                                ("--harbor-pass-env", getattr(args, "harbor_pass_env", ()))) if value]  # fmt: skip
        if harbor_only:
            raise SystemExit(f"{', '.join(harbor_only)}: only with --driver harbor")
        return None
    if getattr(args, "swe_repos", None):
        raise SystemExit("--driver harbor runs Harbor tasks: --swe-repos is for Interceptor's own SWE runner")
    from agents.harbor.driver import HarborConfig, HarborDriver

    environment_kwargs = _pairs(getattr(args, "harbor_env_kwarg", ()), "--harbor-env-kwarg")
    agent_kwargs = _pairs(getattr(args, "harbor_agent_kwarg", ()), "--harbor-agent-kwarg")
    try:
        return HarborDriver(HarborConfig(
            agent=args.harbor_agent, environment=args.harbor_env, install=args.harbor_install,
            api_format=args.harbor_api_format, trials_dir=Path(args.harbor_trials).resolve() if args.harbor_trials else None,
            environment_kwargs=environment_kwargs, agent_kwargs=agent_kwargs,
            pass_env=tuple(getattr(args, "harbor_pass_env", ())),
        ))  # fmt: skip
    except AgentConfigError as exc:
        raise SystemExit(f"--driver harbor: {exc}") from None


def check_driver(driver, server: InterceptionServer, tasks: Sequence[Task]) -> None:
    try:
        driver.check(server, list(tasks))
    except AgentConfigError as exc:
        raise SystemExit(f"--driver harbor: {exc}") from None


def _pairs(items, flag: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} is KEY=VALUE, not {item!r}")
        pairs.append((key, value))
    return tuple(pairs)
