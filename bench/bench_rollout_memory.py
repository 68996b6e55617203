"""Memory an idle rollout holds, per recorded token, in `interception_gate` mode.

    python bench/bench_rollout_memory.py [--tokens 16000] [--rollouts 1] [--model DIR] [--json OUT]

One process runs an instant fake upstream and the server (recording, with its journal), warms it with a finished
rollout, then drives one rollout through a tool loop (10 tools, tool results of ~1.5 kB of code-like text, as the
openai SDK would send them) until it has recorded `--tokens` tokens. With the rollout idle (between two turns, as
while its agent runs a tool), Python's heap is measured with tracemalloc after a full collection, before and
after; the difference over the recorded tokens is the figure. What it holds is then broken down: the branches'
token storage, the rollout's request-body cache, and everything else (messages, trace, events).

With `--rollouts N`, N rollouts are driven one after the other and left idle together, and the figure is the
heap difference over all their tokens: what the process holds that does not belong to one rollout (the event
loop's cancelled timers, which asyncio purges in bulk, the tokenizer's and orjson's caches) is then shared, as it
is among a server's many idle rollouts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from bench.bench_server import InstantUpstream, model_or_tiny  # noqa: E402
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {name} tool of a coding agent: " + "it does what its name says. " * 6,
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "a file path"},
                                                    "command": {"type": "string", "description": "a command"}},
                   "required": ["path"]}}}
    for name in ("bash", "read", "write", "edit", "grep", "glob", "ls", "todo", "fetch", "task")]


def tool_output(turn: int) -> str:
    return "".join(f"def function_{turn}_{i}(value):\n    return value * {i} + {turn}  # step {i}\n" for i in range(24))


async def drive(url: str, secret: str, http: aiohttp.ClientSession, server: InterceptionServer, rollout_id: str,
                tokens: int) -> None:
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    messages = [{"role": "system", "content": "You are a coding agent. " * 40}, {"role": "user", "content": "Fix it."}]
    turn = 0
    while server.registry.get(rollout_id).trajectory.recorded_tokens() < tokens:
        body = {"model": "p", "messages": messages, "tools": TOOLS, "max_tokens": 24}
        async with http.post(url + "/chat/completions", data=orjson.dumps(body), headers=headers) as resp:
            reply = orjson.loads(await resp.read())
        assert resp.status == 200, reply
        message = reply["choices"][0]["message"]
        messages.append(message)
        messages.append({"role": "user", "content": tool_output(turn)})
        turn += 1


def held() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def measure(model: str, tokens: int, rollouts: int = 1) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model)
    filler = tokenizer.encode(" the", add_special_tokens=False)[0]
    async with InstantUpstream(filler, tokenizer.eos_token_id, max_model_len=400_000) as upstream:
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=Path(model),
                              default_max_tokens=24, record_path=Path(tempfile.mkdtemp()) / "rollouts.jsonl")
        async with InterceptionServer(config) as server:
            async with aiohttp.ClientSession() as http:
                warm = server.open_rollout()
                await drive(warm.base_url, warm.secret, http, server, warm.id, 2_000)
            await server.finish_rollout(warm.id)
            await upstream.reset_connections()
            tracemalloc.start()
            before = held()
            handles = [server.open_rollout() for _ in range(rollouts)]
            for handle in handles:
                async with aiohttp.ClientSession() as http:  # closed before measuring: not the rollout's
                    await drive(handle.base_url, handle.secret, http, server, handle.id, tokens)
            await asyncio.sleep(0.1)
            await upstream.reset_connections()  # nor are the upstream's buffers (it runs in this process)
            after = held()
            idle = [server.registry.get(handle.id) for handle in handles]
            recorded = sum(rollout.trajectory.recorded_tokens() for rollout in idle)
            storage = sum(sum(map(sys.getsizeof, b.parts)) + 8 * len(b.parts) + 4 * len(b.sampled_logprobs)
                          for rollout in idle for b in rollout.trajectory._branches)
            caches = sum(48 * len(s.prefixes) + 24 for rollout in idle for c in rollout.body_caches.values()
                         for s in c._states)
            tracemalloc.stop()
            for handle in handles:
                await server.finish_rollout(handle.id)
    total = after - before
    return {"rollouts": rollouts, "recorded_tokens": recorded, "bytes_held": total, "bytes_per_token": round(total / recorded, 2),
            "token_storage_bytes_per_token": round(storage / recorded, 2),
            "cached_body_bytes_per_token": round(caches / recorded, 2),
            "other_bytes_per_token": round((total - storage - caches) / recorded, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: the tiny model with the real Qwen vocabulary)")
    parser.add_argument("--tokens", type=int, default=16_000, help="tokens each rollout records")
    parser.add_argument("--rollouts", type=int, default=1, help="idle rollouts measured together")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    model = model_or_tiny(args.model)
    results = asyncio.run(measure(model, args.tokens, args.rollouts))
    for key, value in results.items():
        print(f"{key:>32}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
