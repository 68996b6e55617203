"""Record agent-shaped sessions: real agents working through the gate on a real source tree, kept as a replayable
corpus of request streams.

    python -m bench.replay.record [--agents claude,codex,pi,opencode] [--packages click,jinja2] [--steps 80]
                                  [--window 200000] [--out bench/replay/corpus]

For each agent and package: the package's source (as installed from the registry) is copied into a fresh
`LocalSandbox`'s workspace, and the agent is told to review it, in front of the interception gate and
`policy.WorkPolicy` (a scripted policy that reads 150-250 lines at a time, greps, edits, writes and runs a
unittest, `--steps` steps, then reports). The agent believes the policy's context is `--window` tokens, so it
compacts where it would. A recording proxy between agent and gate keeps every request: its path under `/v1`, its
headers (no credential), the body as sent, the gate's answer as it went back (SSE comments included), and when each
began and ended. One file per session, `<agent>-<package>.json.gz`:

    {"agent", "package", "window", "steps", "record": {kinds, turns, tokens}, "requests": [...],
     "completions": {prompt_key: {"ids", "logprobs"}}}

`completions` are the policy's replies keyed by their prompt (`policy.prompt_key`): a replay answers the gate
from them. The corpus is large (tens of MB): made by this script, never committed (`.gitignore`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import importlib.util
import shutil
import sys
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from agents import AgentRollout, Heartbeat, LocalSandbox, RunLimits  # noqa: E402
from agents.specs.claude import ClaudeAgent  # noqa: E402
from agents.specs.codex import CodexAgent  # noqa: E402
from agents.specs.opencode import OpenCodeAgent  # noqa: E402
from agents.specs.pi import PiAgent  # noqa: E402
from bench.bench_server import model_or_tiny  # noqa: E402
from bench.replay.policy import WorkPolicy, source_tree  # noqa: E402
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig  # noqa: E402
from tests.agents.recording_proxy import RecordingProxy  # noqa: E402

CORPUS = ROOT / "bench" / "replay" / "corpus"
_KEPT_HEADERS = frozenset({"content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta",
                           "x-stainless-retry-count", "x-stainless-timeout", "openai-beta", "session_id", "originator",
                           "x-openai-subagent", "x-codex-turn-metadata", "version", "x-app", "anthropic-dangerous-direct-browser-access"})


def agent_spec(name: str, window: int):
    return {"claude": lambda: ClaudeAgent(),
            "codex": lambda: CodexAgent(context_window=window),
            "pi": lambda: PiAgent(context_window=window, compaction=True, max_tokens=4096),
            "opencode": lambda: OpenCodeAgent(context_window=window, max_tokens=4096)}[name]()


async def record_session(agent: str, package: str, *, model: Path, steps: int, window: int) -> dict:
    package_dir = Path(importlib.util.find_spec(package).submodule_search_locations[0])
    tokenizer = AutoTokenizer.from_pretrained(model)
    session = f"S-{uuid.uuid4().hex[:8]}"
    instruction = (f"Session {session}. Review the `{package}` package in this directory: read its source in order, "
                   "search it where a name needs explaining, mark each file you reviewed with a comment line, and "
                   "check after each edit that the package still imports (a small unittest). Report when done.")
    async with WorkPolicy(tokenizer, [], steps=steps, max_model_len=window + 8192) as policy:
        config = ServerConfig(upstream=UpstreamConfig(base_url=policy.url), model_dir=model, max_model_len=window)
        async with InterceptionServer(config) as server, LocalSandbox() as box:
            shutil.copytree(package_dir, box.workspace / package)
            policy.files = source_tree(box.workspace / package)
            handle = server.open_rollout()
            heartbeat = Heartbeat()
            async with RecordingProxy(target=server.url, on_activity=heartbeat.beat) as proxy:
                launch = agent_spec(agent, window).prepare(AgentRollout(
                    base_url=proxy.rebase(handle.base_url), secret=handle.secret,
                    model=server.config.served_model_name, workspace=box.workspace, home=box.home,
                    instruction=instruction))
                started = time.monotonic()
                result = await box.run(launch, limits=RunLimits(wall_s=3600, idle_s=600), activity=heartbeat)
            record = await server.finish_rollout(handle.id)
    prefix = f"/rollout/{handle.id}/v1"
    requests = []
    for r in proxy.requests:
        requests.append({
            "at": round(r.at - started, 4), "done": round(r.done - started, 4) if r.done else None,
            "method": r.method, "path": r.path.removeprefix(prefix), "status": r.status,
            "headers": {str(k): str(v) for k, v in r.headers.items() if k.lower() in _KEPT_HEADERS},
            "body": r.raw.decode(), "response": base64.b64encode(bytes(r.response)).decode(),
        })
    return {
        "agent": agent, "package": package, "session": session, "window": window, "steps": steps,
        "exit_code": result.exit_code, "outcome": result.outcome,
        "record": {"status": record.status, "kinds": [s.kind for s in record.samples],
                   "turns": [len(s.turns) for s in record.samples],
                   "prompt_tokens": record.usage.get("prompt_tokens"),
                   "completion_tokens": record.usage.get("completion_tokens")},
        "requests": requests, "completions": policy.completions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", default="claude,codex,pi,opencode")
    parser.add_argument("--packages", default="click,jinja2")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--window", type=int, default=200_000)
    parser.add_argument("--model", help="model directory (default: the tiny model with the real Qwen vocabulary)")
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = Path(model_or_tiny(args.model))
    for agent in args.agents.split(","):
        for package in args.packages.split(","):
            began = time.monotonic()
            session = asyncio.run(record_session(agent, package, model=model, steps=args.steps, window=args.window))
            path = args.out / f"{agent}-{package}.json.gz"
            path.write_bytes(gzip.compress(orjson.dumps(session), compresslevel=6))
            print(f"{path.name}: {len(session['requests'])} requests, exit {session['exit_code']} "
                  f"({session['outcome']}), record {session['record']['status']} {session['record']['kinds']}, "
                  f"{session['record']['prompt_tokens']} prompt tokens, {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
