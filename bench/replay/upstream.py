"""The model side of the replay, as its own process: it answers every target from the recorded corpus.

    python bench/replay/upstream.py --corpus bench/replay/corpus --model DIR     # prints {"url": ...}, serves until SIGTERM

- `POST /v1/completions` (what the gate sends): the prompt is found by `policy.prompt_key` among the corpus's
  completions and answered with the ids and logprobs recorded (a prompt not recorded: 400).
- Every other recorded request (`/v1/chat/completions`, `/v1/messages`, `/v1/responses`, `count_tokens`, what
  `direct` and `black_box` send): found by `corpus.request_key` and answered with the recorded status and bytes, a
  stream as a stream.
- `GET /v1/models`: the context window the corpus was recorded with (so the gate refuses what it refused then).
- `POST /admin/timing {"prefill_tps", "decode_tps"}`: how long answers take from now on (`corpus.ModelTiming`;
  zeros: at once). A completion takes the time of the recorded turn it answers, so every target waits alike.
With `REPLAY_MISSES=FILE`, the tail of each prompt not found is appended to FILE (to see where a replay parts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peers.serving import serve_until_stopped  # noqa: E402
from bench.replay.corpus import ModelTiming, load_corpus, request_key  # noqa: E402
from bench.replay.policy import FIRST_MESSAGES, KEY_IDS, TURN_MARK, key_of, prompt_key  # noqa: E402


class ReplayModel:
    def __init__(self, corpus: Path, model: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.turn_mark = self.tokenizer.token_to_id(TURN_MARK)
        sessions = load_corpus(corpus)
        self.window = min(s.window for s in sessions)
        self.timing = ModelTiming()
        self.requests = {r.key: r for s in sessions for r in s.requests}
        self.completions: dict[str, tuple[bytes, int, int]] = {}  # key -> (choice JSON, new tokens, ids)
        for session in sessions:
            previous = 0
            for key, completion in session.completions.items():
                length = int(key.split(":", 1)[0])
                new = length - previous if length > previous else length
                previous = length
                choice = {"index": 0, "text": "", "token_ids": completion["ids"], "prompt_token_ids": None,
                          "logprobs": {"token_logprobs": completion["logprobs"]}, "stop_reason": None,
                          "finish_reason": "stop"}
                self.completions[key] = (orjson.dumps(choice), new, len(completion["ids"]))
        self.misses = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/admin/timing", self.set_timing)
        app.router.add_route("*", "/v1/{tail:.*}", self.recorded)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "replay", "max_model_len": self.window}]})

    async def set_timing(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.timing = ModelTiming(prefill_tps=float(body["prefill_tps"]), decode_tps=float(body["decode_tps"]))
        return web.json_response({"ok": True, "misses": self.misses})

    async def complete(self, request: web.Request) -> web.Response:
        raw = await request.read()
        key, length = self._key(raw)
        found = self.completions.get(key)
        if found is None:
            prompt = orjson.loads(raw)["prompt"]
            self.misses += 1
            if os.environ.get("REPLAY_MISSES"):
                with open(os.environ["REPLAY_MISSES"], "a") as out:
                    out.write(repr(self.tokenizer.decode(prompt[-3 * KEY_IDS:], skip_special_tokens=False)) + "\n")
            return web.json_response({"error": {"message": "prompt not in the corpus"}}, status=400)
        choice, new, completion = found
        await _wait(self.timing.seconds(new, completion))
        usage = b'{"prompt_tokens":%d,"completion_tokens":%d}' % (length, completion)
        return web.Response(body=b'{"model":"replay","choices":[' + choice + b'],"usage":' + usage + b"}",
                            content_type="application/json")

    def _key(self, raw: bytes) -> tuple[str, int]:
        """`prompt_key` and the prompt's length, read off the body's bytes where the prompt is a JSON array of ids
        without spaces (as the gate writes it): a 100k-id prompt parsed into Python ints took this process a few ms
        a turn, as long as the gate's own work, and the model is not what is measured."""
        start = raw.find(b'"prompt":[')
        end = raw.find(b"]", start) if start >= 0 else -1
        inner = raw[start + 10:end] if end >= 0 else b" "
        if b" " in inner or not inner:
            prompt = orjson.loads(raw)["prompt"]
            return prompt_key(prompt, self.turn_mark), len(prompt)
        length = int(np.count_nonzero(np.frombuffer(inner, np.uint8) == ord(","))) + 1
        # (two marks side by side would share a comma and count once: a chat template never writes them so)
        messages = (b"," + inner + b",").count(b",%d," % self.turn_mark)
        if messages <= FIRST_MESSAGES:
            return prompt_key(orjson.loads(b"[" + inner + b"]"), self.turn_mark), length
        return key_of(length, messages, [int(x) for x in inner.rsplit(b",", KEY_IDS)[-KEY_IDS:]]), length

    async def recorded(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        found = self.requests.get(request_key(request.method, request.path.removeprefix("/v1"), raw))
        if found is None:
            self.misses += 1
            return web.json_response({"error": {"message": "request not in the corpus"}}, status=400)
        await _wait(self.timing.seconds(found.new_tokens, found.completion_tokens))
        kind = "text/event-stream" if found.stream else "application/json"
        return web.Response(status=found.status or 200, body=found.response, content_type=kind)


async def _wait(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path, help="the tokenizer the corpus was recorded with")
    args = parser.parse_args()
    asyncio.run(serve_until_stopped(ReplayModel(args.corpus, args.model).app()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
