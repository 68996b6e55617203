"""Latency the interception server adds per turn, and its throughput, against an instant fake upstream.

    python bench/bench_server.py [--turns 200] [--json OUT]

latency: a conversation is grown to ~1k and ~32k tokens of history through the server (interception_gate,
tiny model with the real Qwen vocabulary). Then, turn by turn, the same client times a chat call through the
server and, right after, a direct `/v1/completions` call to the same upstream with a prompt of the same length.
Reported: p50/p99 of both, the added milliseconds (paired differences) and the ratio.

throughput: 64 rollouts run tool-loop turns concurrently for a fixed time; turns per second through the server.

The fake upstream answers at once with pre-made token ids: it measures the proxy, not a model. The load generator
runs in the same process as the server, on the same 2 cores, so these figures are a floor for the server alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from aiohttp import web  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from bench.peers.serving import start_app  # noqa: E402
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig  # noqa: E402


class InstantUpstream:
    """/v1/completions that returns `max_tokens` filler tokens ending with the end-of-turn token, at once."""

    def __init__(self, filler: int, end_of_turn: int, max_model_len: int) -> None:
        self.filler, self.end_of_turn, self.max_model_len = filler, end_of_turn, max_model_len
        self.url = ""

    async def __aenter__(self) -> InstantUpstream:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        self._runner, self.url = await start_app(app)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    async def reset_connections(self) -> None:
        """Close the keep-alive connections (and the last request each holds)."""
        for connection in list(self._runner.server.connections):
            connection.force_close()
        await asyncio.sleep(0.05)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "instant", "max_model_len": self.max_model_len}]})

    async def _complete(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        n = max(1, int(body.get("max_tokens", 2)))
        ids = [self.filler] * (n - 1) + [self.end_of_turn]
        choice = {"index": 0, "text": "", "token_ids": ids, "logprobs": {"token_logprobs": [-0.1] * n},
                  "finish_reason": "stop", "stop_reason": None, "prompt_token_ids": None}
        return web.Response(body=orjson.dumps({"model": "instant", "choices": [choice]}),
                            content_type="application/json")


def model_or_tiny(model: str | None) -> str:
    """`model`, or a tiny model with the real Qwen vocabulary built in a temp dir (what the benchmarks default to)."""
    if model is not None:
        return model
    from trainer.models.tiny_model import TinyModelSpec, make_tiny_model

    return str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", TinyModelSpec(real_vocab=True)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(server: InterceptionServer, upstream: InstantUpstream, http: aiohttp.ClientSession,
                  history_tokens: int, turns: int) -> dict:
    rollout = server.open_rollout()
    headers = {"Authorization": f"Bearer {rollout.secret}"}
    url = rollout.base_url + "/chat/completions"
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "start"}]

    async def turn(max_tokens: int) -> float:
        started = time.perf_counter()
        async with http.post(url, data=orjson.dumps({"model": "p", "messages": messages, "max_tokens": max_tokens}),
                             headers={**headers, "Content-Type": "application/json"}) as resp:
            body = await resp.read()
        elapsed = time.perf_counter() - started
        assert resp.status == 200, body
        messages.append(orjson.loads(body)["choices"][0]["message"])
        messages.append({"role": "user", "content": "next"})
        return elapsed

    while _recorded(server, rollout.id) < history_tokens:
        await turn(max_tokens=min(1000, max(2, history_tokens - _recorded(server, rollout.id))))
    through, direct = [], []
    for _ in range(turns):
        through.append(await turn(max_tokens=2))
        prompt = list(range(100, 100 + _recorded(server, rollout.id)))
        started = time.perf_counter()
        async with http.post(upstream.url + "/v1/completions",
                             data=orjson.dumps({"model": "instant", "prompt": prompt, "max_tokens": 2,
                                                "return_token_ids": True, "logprobs": 0}),
                             headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
        direct.append(time.perf_counter() - started)
    added = [t - d for t, d in zip(through, direct)]
    return {
        "history_tokens": _recorded(server, rollout.id),
        "server_ms_p50": pct(through, 0.5) * 1e3, "server_ms_p99": pct(through, 0.99) * 1e3,
        "direct_ms_p50": pct(direct, 0.5) * 1e3, "direct_ms_p99": pct(direct, 0.99) * 1e3,
        "added_ms_p50": pct(added, 0.5) * 1e3, "added_ms_p99": pct(added, 0.99) * 1e3,
        "ratio_p50": pct(through, 0.5) / pct(direct, 0.5),
    }


def _recorded(server: InterceptionServer, rollout_id: str) -> int:
    trajectory = server.registry.get(rollout_id).trajectory  # the live rollout, not the driver view
    return trajectory.recorded_tokens() if trajectory else 0


async def throughput(server: InterceptionServer, http: aiohttp.ClientSession, rollouts: int, seconds: float) -> dict:
    deadline = time.perf_counter() + seconds
    counts = [0] * rollouts

    async def loop(index: int) -> None:
        handle = server.open_rollout()
        headers = {"Authorization": f"Bearer {handle.secret}", "Content-Type": "application/json"}
        messages = [{"role": "user", "content": f"task {index}"}]
        while time.perf_counter() < deadline:
            async with http.post(handle.base_url + "/chat/completions",
                                 data=orjson.dumps({"model": "p", "messages": messages, "max_tokens": 8}),
                                 headers=headers) as resp:
                body = orjson.loads(await resp.read())
            messages.append(body["choices"][0]["message"])
            messages.append({"role": "user", "content": "again"})
            counts[index] += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for index in range(rollouts):
            group.create_task(loop(index))
    elapsed = time.perf_counter() - started
    return {"rollouts": rollouts, "turns": sum(counts), "seconds": elapsed, "turns_per_s": sum(counts) / elapsed}


async def main_async(args: argparse.Namespace) -> dict:
    model = model_or_tiny(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    filler = tokenizer.encode(" the", add_special_tokens=False)[0]
    results: dict = {}
    async with InstantUpstream(filler, tokenizer.eos_token_id, max_model_len=200_000) as upstream:
        # Recording as training does: every turn goes to the write-ahead journal beside the record file.
        config = ServerConfig(upstream=UpstreamConfig(base_url=upstream.url), model_dir=Path(model),
                              default_max_tokens=16, record_path=Path(tempfile.mkdtemp()) / "rollouts.jsonl")
        async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
            for history in (1_000, 32_000):
                results[f"latency_{history // 1000}k"] = await latency(server, upstream, http, history, args.turns)
            results["throughput_64"] = await throughput(server, http, 64, args.seconds)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: the tiny model with the real Qwen vocabulary)")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    for name, figures in results.items():
        print(name)
        for key, value in figures.items():
            print(f"  {key:>16}: {value:.3f}" if isinstance(value, float) else f"  {key:>16}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
