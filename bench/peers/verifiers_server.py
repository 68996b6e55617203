"""verifiers' interception server (verifiers 0.4.0, `verifiers.v1.interception`) as its own process.

    bench/.venv-peers/bin/python bench/peers/verifiers_server.py --upstream URL

Prints {"url": ...} (a small admin app) on one line once both listen, and serves until SIGTERM.
`POST /rollouts` opens a rollout -> {"id", "base_url", "secret"}; `POST /rollouts/{id}/finish` closes it.

This is how verifiers' own rollout (`verifiers/v1/rollout.py`, `Rollout.__init__` and `open`) uses the server:
each rollout is a `RolloutSession` (a `ModelContext` naming the model and the endpoint, and a fresh `Trace`)
registered on one shared `InterceptionServer`, which hands back the model bearer the agent's SDK sends. In 0.4.0
there is no queue and no loop outside the server: its request handler (`InterceptionServer.handle_request` in
`verifiers/v1/interception/server.py`) parses the body, matches the messages into the trace's message graph
(`graph.prepare_turn`), calls the upstream through the session's client (`EvalClient.get_response`: httpx,
`POST {base_url}/chat/completions`), validates the reply with the chat dialect's pydantic models, commits the turn
to the graph, records the call and returns the provider's JSON. So this script only registers sessions; the
forwarding is verifiers' own code, unchanged. The eval client is the one that relays chat completions (its train
client renders tokens itself and needs a vLLM with the renderers endpoint, which the fake upstream is not).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass

from aiohttp import web
from verifiers.v1.clients.client import ModelContext
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.interception import InterceptionServer
from verifiers.v1.session import RolloutSession
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

from serving import serve_until_stopped  # this folder: the scripts run as programs

UPSTREAM_MODEL = "instant"
API_KEY_VAR = "BENCH_UPSTREAM_API_KEY"  # unset: verifiers sends "EMPTY", which the fake upstream accepts


@dataclass(frozen=True)
class Registration:
    model_secret: str
    state_secret: str


class Rollouts:
    """Opens and closes rollouts on the interception server, as `Rollout.open`/`close` do through `acquire`."""

    def __init__(self, server: InterceptionServer, upstream: str) -> None:
        self.server = server
        self.client = EvalClientConfig(base_url=upstream.rstrip("/") + "/v1", api_key_var=API_KEY_VAR)
        self.open: dict[str, Registration] = {}

    async def open_rollout(self, request: web.Request) -> web.Response:
        trace = Trace(task=TraceTask(type="BenchTask", data={}), agent=AgentInfo(config={}))
        session = RolloutSession(ctx=ModelContext(model=UPSTREAM_MODEL, client=self.client), trace=trace)
        model_secret, state_secret = self.server.register(session)
        self.open[trace.id] = Registration(model_secret, state_secret)
        return web.json_response({"id": trace.id, "base_url": self.server.base_url + "/v1", "secret": model_secret},
                                 status=201)

    async def finish_rollout(self, request: web.Request) -> web.Response:
        registration = self.open.pop(request.match_info["rid"], None)
        if registration is None:
            return web.json_response({"error": "unknown rollout"}, status=404)
        self.server.unregister(registration.model_secret, registration.state_secret)
        return web.json_response({"finished": True})


async def serve(upstream: str) -> None:
    async with InterceptionServer() as server:  # no tunnel: every consumer is on this host
        rollouts = Rollouts(server, upstream)
        admin = web.Application()
        admin.router.add_post("/rollouts", rollouts.open_rollout)
        admin.router.add_post("/rollouts/{rid}/finish", rollouts.finish_rollout)
        await serve_until_stopped(admin)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the fake upstream's base URL")
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(parser.parse_args().upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
