"""The `interceptor` command line: a parser that packages contribute subcommands to.

This module owns `main()`, the parser and the subcommands of its own package (`serve`, `inspect`, `view`, `rescore`).
Higher packages (`agents`, `trainer`) contribute theirs through the entry-point group `interceptor.commands`
(pyproject.toml): each entry point names a `register(commands: CommandRegistry)` function, so nothing here imports
upward. Handlers import what they need when they run, so `interceptor serve` and `interceptor inspect` never load
torch.

A package whose commands fail to load (an extra not installed) does not break the others: naming one of its commands
answers with the extra to install (exit 2), as does a handler that finds an extra's dependency missing. Two packages
registering the same command name is an error naming both.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ENTRY_POINT_GROUP", "CommandConflict", "CommandRegistry", "Handler", "main"]

ENTRY_POINT_GROUP = "interceptor.commands"
DISTRIBUTION = "interceptor"  # whose extras (pyproject.toml) name the optional dependencies of commands

# What `interceptor --help` has always said about itself (kept apart from the module docstring above).
_DESCRIPTION = (
    "The `interceptor` command. Subcommands import what they need when they run, so `interceptor serve` and\n"
    "`interceptor inspect` never load torch."
)

Handler = Callable[[argparse.Namespace], int]


class CommandConflict(Exception):
    """Two packages registered a subcommand of the same name."""


class CommandsEntryPoint(Protocol):
    """The part of `importlib.metadata.EntryPoint` the command line uses."""

    name: str
    value: str

    def load(self) -> Any: ...


class CommandRegistry:
    """What a package's `register(commands)` is given: `add` puts one subcommand on the `interceptor` parser."""

    def __init__(self, subparsers: argparse._SubParsersAction, *, package: str,
                 owners: dict[str, str] | None = None) -> None:
        self._subparsers = subparsers
        self._package = package
        self._owners = {} if owners is None else owners  # command name -> the package that registered it

    def for_package(self, package: str) -> CommandRegistry:
        """The same parser, adding commands in `package`'s name (so a clash can name both packages)."""
        return CommandRegistry(self._subparsers, package=package, owners=self._owners)

    def add(self, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        if (owner := self._owners.get(name)) is not None:
            raise CommandConflict(f"the command {name!r} is registered twice: by {owner} and by {self._package}")
        self._owners[name] = self._package
        sub = self._subparsers.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._owners)


@dataclass(frozen=True, slots=True)
class _Unavailable:
    """A package whose commands could not be registered, and why."""

    source: str  # "trainer (trainer.cli:register)"
    error: BaseException

    def explain(self) -> str:
        missing = _missing_module(self.error)
        reason = f"{type(self.error).__name__}: {self.error}"
        if missing is not None and (extra := _extra_providing(missing)) is not None:
            return f"the commands of {self.source} need {missing}: pip install '{DISTRIBUTION}[{extra}]' ({reason})"
        return f"the commands of {self.source} could not be loaded ({reason})"


def _serve(args: argparse.Namespace) -> int:
    from interceptor.serve_main import run_serve_from_args

    return run_serve_from_args(args)


def _inspect(args: argparse.Namespace) -> int:
    from interceptor.tools.inspect import run_inspect_from_args

    return run_inspect_from_args(args)


def _view(args: argparse.Namespace) -> int:
    from interceptor.viewer.main import run_view_from_args

    return run_view_from_args(args)


def _rescore(args: argparse.Namespace) -> int:
    from interceptor.tools.rescore import run_rescore_from_args

    return run_rescore_from_args(args)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _register_own(commands: CommandRegistry) -> None:
    serve = commands.add("serve", _serve, "run the interception server in front of a policy server")
    serve.add_argument("--upstream", required=True, action="append",
                       help="base URL of vLLM or the local engine (or an OpenAI API); repeat it for replicas of the "
                            "policy, each rollout pinned to one")
    serve.add_argument("--model", help="the model directory (tokenizer and chat template); interception_gate")
    serve.add_argument("--mode", choices=("interception_gate", "black_box"), default="interception_gate")
    serve.add_argument(
        "--no-tiktoken-twin", dest="tiktoken_twin", action="store_false",
        help="encode with the model's tokenizer only; by default ASCII text is encoded by tiktoken where that gives "
        "the same ids (checked when the tokenizer loads, and audited while serving)",
    )
    serve.add_argument(
        "--no-suffix-writer", dest="suffix_writer", action="store_false",
        help="render every turn's new messages through the chat template; by default, for the Qwen templates whose "
        "text says how, a steady turn's suffix is written directly (checked when the template loads, and audited)",
    )
    serve.add_argument(
        "--no-fast-lane", dest="fast_lane", action="store_false",
        help="serve every request through aiohttp; by default the gate's turns and the JSON routes are read and answered "
        "straight off the socket",
    )
    serve.add_argument(
        "--no-lean-client", dest="lean_client", action="store_false",
        help="call the policy server through aiohttp's client; by default its JSON calls go through a lean keep-alive "
        "HTTP/1.1 pool when its URL is plain http",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--box-listen", metavar="HOST:PORT",
                       help="also serve the rollout routes alone (never the admin API) here, for boxes that are not "
                       "on this host's loopback: a container network's gateway, or an address remote sandboxes reach")
    serve.add_argument("--box-url", metavar="URL",
                       help="what remote boxes are told to use for --box-listen, when not http://HOST:PORT (a public "
                       "name, a tunnel)")
    serve.add_argument(
        "--record",
        help="JSON Lines file for finished rollouts. With --workers N > 1 each worker writes its own file beside it "
        "(rollouts.jsonl -> rollouts.w0.jsonl, rollouts.w1.jsonl, ...), with its own journal and crash recovery: "
        "restart with the same N",
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="server processes, one core each (default 1). With N > 1, --host:--port is a front holding the admin "
        "API and /health; rollouts are shared among the workers, and each rollout's base URL names its worker's port",
    )
    serve.add_argument(
        "--admin-token-file", help="write the admin token here (mode 0600) when INTERCEPTOR_ADMIN_TOKEN is unset"
    )

    inspect = commands.add("inspect", _inspect, "summarise a trajectory file, or show one rollout's turns")
    inspect.add_argument("file")
    inspect.add_argument("--rollout", help="show this rollout's samples and turns")
    inspect.add_argument("--model", help="a model directory whose tokenizer decodes the spans")
    view = commands.add("view", _view, "a web page over a run's records and metrics: the table, each rollout's tokens, "
                                       "live while the run writes")
    from interceptor.viewer.arguments import add_view_arguments

    add_view_arguments(view)
    rescore = commands.add("rescore", _rescore, "score a run's samples on a policy server again and report the gap "
                                                "between its logprobs and the recorded ones")
    rescore.add_argument("records", help="a JSON Lines file of rollout records (`serve --record`)")
    rescore.add_argument("--upstream", required=True,
                         help="base URL of vLLM or the local engine; an API key, if it needs one, is read from "
                              "INTERCEPTOR_UPSTREAM_API_KEY")
    rescore.add_argument("--model", help="the served model name (default: the first one /v1/models lists)")
    rescore.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    rescore.add_argument("--policy-version", type=int, metavar="N",
                         help="only samples that policy version N sampled (a training run's records hold several)")
    # None: RescoreConfig's default, stated once there
    rescore.add_argument("--concurrency", type=_positive, metavar="N", help="requests in flight at once")
    rescore.add_argument("--timeout", type=float, metavar="SECONDS", help="the most one sample's scoring may take")


def _installed_entry_points() -> list[CommandsEntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _build_parser(
    entry_points: Iterable[CommandsEntryPoint],
) -> tuple[argparse.ArgumentParser, CommandRegistry, list[_Unavailable]]:
    parser = argparse.ArgumentParser(prog="interceptor", description=_DESCRIPTION)
    commands = CommandRegistry(parser.add_subparsers(dest="command", required=True), package="interceptor")
    _register_own(commands)
    unavailable: list[_Unavailable] = []
    for entry_point in sorted(entry_points, key=lambda ep: ep.name):
        source = f"{entry_point.name} ({entry_point.value})"
        try:
            register = entry_point.load()
            register(commands.for_package(source))
        except CommandConflict:
            raise
        except Exception as exc:  # a capture point: one package that cannot load must not take down the others
            unavailable.append(_Unavailable(source, exc))
    if unavailable:
        parser.epilog = "not available: " + "; ".join(u.explain() for u in unavailable)
    return parser, commands, unavailable


def _missing_module(error: BaseException) -> str | None:
    """The top-level module whose absence caused `error` (or its cause), if that is what happened."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name.partition(".")[0]
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _extra_providing(module: str) -> str | None:
    """The extra of this distribution that installs `module`, read from its metadata ('torch' -> 'train')."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = _normalized(module)
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        name = re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0]
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra is not None and _normalized(name) == wanted:
            return extra.group(1)
    return None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand the user named: the top-level parser has no options but -h, so it is the first word."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def main(argv: Sequence[str] | None = None, *, entry_points: Iterable[CommandsEntryPoint] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser, commands, unavailable = _build_parser(
            _installed_entry_points() if entry_points is None else entry_points
        )
    except CommandConflict as exc:
        print(f"interceptor: error: {exc}", file=sys.stderr)
        return 2
    named = _named_command(argv)
    if unavailable and named is not None and named not in commands.names:
        for package in unavailable:
            print(f"interceptor {named}: error: not available here; {package.explain()}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        # A command whose extra is not installed says which one, instead of a traceback from its lazy import.
        missing = _missing_module(exc)
        extra = None if missing is None else _extra_providing(missing)
        if extra is None:
            raise
        print(f"interceptor {args.command}: error: needs {missing}, which is not installed: "
              f"pip install '{DISTRIBUTION}[{extra}]'", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
