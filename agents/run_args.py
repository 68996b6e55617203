"""The command-line arguments of `interceptor run`, kept apart from the runner so building the parser stays light."""

from __future__ import annotations

import argparse

from agents.sandbox.backends import CHOICES as SANDBOX_CHOICES
from agents.specs.registry import AGENTS

__all__ = ["add_driver_arguments", "add_run_arguments"]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", choices=tuple(AGENTS), default="pi")
    parser.add_argument("--command", help="the command agent's command line (reads OPENAI_BASE_URL/OPENAI_API_KEY)")
    parser.add_argument("--tasks", required=True, help="a JSON Lines task file, a Harbor task directory or a "
                        "folder of them (or SWE instances, with --swe-repos)")
    parser.add_argument("--swe-repos", help="read --tasks as SWE-Gym/SWE-bench instances; repositories are here, "
                        "as <owner>__<name>/ git repositories (examples/swe_tiny/make_suite.py builds a suite)")
    parser.add_argument("--upstream", default="local",
                        help="'local' (tiny model on the local engine), a URL, or comma-separated URLs of replicas")
    parser.add_argument("--model", help="model directory (tokenizer, chat template; with --upstream local: weights)")
    parser.add_argument("--mode", choices=("interception_gate", "black_box"), default="interception_gate")
    parser.add_argument("-n", type=int, default=1, help="rollouts per task (a group)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--cpus", type=float, help="per-rollout CPU limit in cores (namespace and Docker sandboxes)")
    parser.add_argument("--memory-mib", type=int, help="per-rollout memory limit, MiB (namespace and Docker sandboxes)")
    parser.add_argument("--pids", type=int, help="per-rollout process/thread limit (namespace and Docker sandboxes)")
    parser.add_argument("--warm-pool", type=int, default=2, metavar="N",
                        help="sandboxes kept prepared per kind, so a rollout's agent starts at once (0: none)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default="runs/latest", help="directory for rollouts.jsonl")
    parser.add_argument(
        "--sandbox", choices=SANDBOX_CHOICES, default="auto",
        help="where agents run: namespace (own Linux namespaces via bubblewrap, only the model endpoint reachable), "
        "local (this user, no isolation: for trusted programs), auto (namespace where possible; the default)",
    )
    add_driver_arguments(parser)


def add_driver_arguments(parser: argparse.ArgumentParser) -> None:
    """Who runs each rollout (`interceptor run` and `train`): Interceptor's own boxes, or Harbor's trials."""
    parser.add_argument("--driver", choices=("interceptor", "harbor"), default="interceptor",
                        help="interceptor: its own sandboxes, agent specs and graders; harbor: each rollout is one "
                        "Harbor trial of a Harbor task (its environment, installed agent and verifier) whose model is "
                        "the rollout (needs scripts/setup-harbor.sh)")  # fmt: skip
    parser.add_argument("--harbor-agent", default="pi", metavar="NAME",
                        help="with --driver harbor: Harbor's agent (pi, claude-code and codex have box installs here)")
    parser.add_argument("--harbor-env", default="docker", metavar="TYPE",
                        help="with --driver harbor: Harbor's environment type; one not on this host (daytona, modal, "
                        "e2b, ...) needs --box-listen")  # fmt: skip
    parser.add_argument("--harbor-install", choices=("box", "harbor"), default="box",
                        help="box: the agent installed here, mounted read-only into the box; harbor: Harbor's own "
                        "installer (the box must reach GitHub, nodejs.org and npm)")  # fmt: skip
    parser.add_argument("--harbor-api-format", metavar="FORMAT",
                        help="the API the agent speaks, as Harbor names it (default: the box install's)")
    parser.add_argument("--harbor-trials", metavar="DIR", help="keep Harbor's trial directories here")
    parser.add_argument("--harbor-agent-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="Harbor's --agent-kwarg (skip_install=true for an image that carries the agent, ...)")
    parser.add_argument("--harbor-env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="Harbor's --environment-kwarg (a remote environment's flavor, namespace, ...)")
    parser.add_argument("--harbor-pass-env", action="append", default=[], metavar="NAME",
                        help="a variable of this environment Harbor gets too (a remote environment's usual credentials "
                        "are passed already: DAYTONA_API_KEY, MODAL_TOKEN_ID/SECRET, HF_TOKEN, E2B_API_KEY, ...)")
    parser.add_argument("--box-listen", metavar="HOST:PORT",
                        help="serve the rollout routes alone (never the admin API) here too, for boxes not on this "
                        "host (a remote Harbor environment)")  # fmt: skip
    parser.add_argument("--box-url", metavar="URL", help="what remote boxes are told for --box-listen, when not "
                        "http://HOST:PORT (a public name, a tunnel)")
