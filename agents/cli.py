"""The subcommand the agents package adds to the `interceptor` command line: `interceptor agents install NAME`.

Registered through the `interceptor.commands` entry point (pyproject.toml); the handler imports the installer only
when it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interceptor.cli import CommandRegistry

__all__ = ["register"]


def _agents_install(args: argparse.Namespace) -> int:
    from agents.specs.install import main as install_main

    return install_main([*args.names, *(["--force"] if args.force else [])])


def register(commands: CommandRegistry) -> None:
    from agents.specs.packages import PACKAGES  # the one list of installable agents (install.py's parser reads it too)

    install = commands.add("agents", _agents_install, "install a pinned agent from npm: interceptor agents install NAME")
    install.add_argument("action", choices=("install",))
    install.add_argument("names", nargs="+", choices=sorted(PACKAGES), metavar="NAME", help=" | ".join(sorted(PACKAGES)))
    install.add_argument("--force", action="store_true")
