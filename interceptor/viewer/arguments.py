"""The `view` command's arguments, apart from the viewer itself so that building the parser imports nothing."""

from __future__ import annotations

import argparse

__all__ = ["TOKEN_ENV", "add_view_arguments"]

TOKEN_ENV = "INTERCEPTOR_VIEW_TOKEN"  # a token for the page, read from the environment (never from argv)


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="a record file (rollouts.jsonl) or a run directory (records + metrics.jsonl)")
    parser.add_argument("--model", default=None,
                        help="a model directory whose tokenizer decodes the tokens (default: the run's setup.json)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8600, help="0 picks a free port")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between looks at the files for new lines")
    parser.add_argument("--prefix", default="", help="serve the page under this path (e.g. /view; / redirects there)")
