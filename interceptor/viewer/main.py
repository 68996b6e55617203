"""`interceptor view RUN_DIR_OR_FILE [--model DIR] [--host H] [--port P]`: serve the viewer on one local port.

RUN_DIR_OR_FILE is a record file (`rollouts.jsonl`) or a run directory (its record files and `metrics.jsonl`, as
`run` and `train` write them). The tokenizer for token text comes from `--model`, else from the model named in the
run's `setup.json`; without one the page shows token ids. A token for the page is read from the environment
variable INTERCEPTOR_VIEW_TOKEN (never from the command line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from aiohttp import web

from interceptor.mounts import mount_under
from interceptor.viewer.app import viewer_app
from interceptor.viewer.arguments import TOKEN_ENV
from interceptor.viewer.detail import TokenText
from interceptor.viewer.index import RecordIndex

__all__ = ["mount_viewer", "open_viewer", "run_model", "run_view_from_args"]


def run_model(target: Path) -> Path | None:
    """The model directory a run's `setup.json` names (beside a record file, or in a run directory), if any."""
    setup = (target if target.is_dir() else target.parent) / "setup.json"
    try:
        model = json.loads(setup.read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(model) if isinstance(model, str) else None


def open_viewer(target: Path | str, *, model: Path | str | None = None, poll_s: float = 1.0,
                token: str | None = None) -> web.Application:
    """The viewer's application for a run (the files are read once here, then followed)."""
    target = Path(target)
    index = RecordIndex.open(target)
    if model is not None:
        text = TokenText.load(model)
    else:  # the run's setup.json names it, perhaps only once the run has started
        text = TokenText.load(run_model(target), locate=lambda: run_model(target))
    return viewer_app(index, text, poll_s=poll_s, token=token)


def mount_viewer(app: web.Application, viewer: web.Application, prefix: str = "/view", *,
                 root: bool = False) -> None:
    """Serve `viewer` under `prefix` on another application (the interception server's port, in a Space)."""
    mount_under(app, prefix, viewer, root=root)


async def _serve(args: argparse.Namespace) -> None:
    target = Path(args.target)
    app = open_viewer(target, model=args.model, poll_s=args.poll, token=os.environ.get(TOKEN_ENV) or None)
    prefix = "/" + args.prefix.strip("/") if args.prefix.strip("/") else ""
    if prefix:
        host = web.Application()
        mount_under(host, prefix, app, root=True)
        app = host
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"viewing {target} at http://{args.host}:{port}{prefix}/ (Ctrl-C stops)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def run_view_from_args(args: argparse.Namespace) -> int:
    try:
        asyncio.run(_serve(args))
    except FileNotFoundError as exc:
        print(f"interceptor view: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
