"""An instant policy server, as its own process: every proxy in bench_gate.py calls this one upstream.

    python bench/peers/fake_upstream.py --model DIR        # prints {"url": ...} on one line, serves until SIGTERM

It answers at once, so what the load generator times is the proxy, not a model. Every turn the "model" calls the
same tool (`read_file`), in both shapes a proxy may ask for:
- `POST /v1/completions` (vLLM's token contract, what interception_gate sends): the Qwen/Hermes text of that tool
  call as token ids of the real vocabulary, then the end-of-turn token, one logprob each;
- `POST /v1/chat/completions` (what black_box, verifiers and the direct baseline send): the same call as an OpenAI
  chat completion, with a fresh tool-call id.
Both parse the request body, as a real server must. `GET /v1/models` reports a 200k context window.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

import orjson
from aiohttp import web
from serving import serve_until_stopped  # this folder: the scripts run as programs
from tokenizers import Tokenizer

MAX_MODEL_LEN = 200_000  # past the longest conversation any benchmark here grows
TOOL_NAME = "read_file"
TOOL_ARGUMENTS = '{"path": "src/module_7.py"}'
CALL_TEXT = f'<tool_call>\n{{"name": "{TOOL_NAME}", "arguments": {TOOL_ARGUMENTS}}}\n</tool_call>'
END_OF_TURN = "<|im_end|>"


class InstantUpstream:
    def __init__(self, model_dir: Path) -> None:
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        end_of_turn = tokenizer.token_to_id(END_OF_TURN)
        if end_of_turn is None:
            raise SystemExit(f"{model_dir} has no {END_OF_TURN} token: build the model with the real Qwen vocabulary")
        self.call_ids = tokenizer.encode(CALL_TEXT, add_special_tokens=False).ids + [end_of_turn]
        self._call_numbers = itertools.count()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)  # a 200k-token prompt as JSON ids, with room
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "instant", "max_model_len": MAX_MODEL_LEN}]})

    async def complete(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        ids = self.call_ids
        choice = {"index": 0, "text": CALL_TEXT, "token_ids": ids, "logprobs": {"token_logprobs": [-0.1] * len(ids)},
                  "finish_reason": "stop", "stop_reason": None, "prompt_token_ids": None}
        usage = {"prompt_tokens": len(body.get("prompt") or ()), "completion_tokens": len(ids)}
        return _json({"id": "cmpl-instant", "object": "text_completion", "created": int(time.time()),
                      "model": "instant", "choices": [choice], "usage": usage})

    async def chat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw)
        call = {"id": f"call_{next(self._call_numbers)}", "type": "function",
                "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        prompt_tokens = len(raw) // 4  # an estimate: this server has no chat template
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(self.call_ids),
                 "total_tokens": prompt_tokens + len(self.call_ids)}
        return _json({"id": "chatcmpl-instant", "object": "chat.completion", "created": int(time.time()),
                      "model": str(body.get("model") or "instant"),
                      "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}],
                      "usage": usage})


def _json(payload: dict) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path, help="a model directory with the real Qwen tokenizer")
    asyncio.run(serve_until_stopped(InstantUpstream(parser.parse_args().model).app()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
