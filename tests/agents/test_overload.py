"""A slow or busy server costs a rollout time, never the rollout: the box's `answer` waits for the server until the
rollout's own limit, and a rollout whose box gave up on one of the server's replies is an infrastructure failure
(`overload`), not the policy's."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
from aiohttp import web

from agents import CommandAgent
from agents.answer_command import write_answer_command
from agents.runner import Runner, RunnerConfig
from agents.tasks import Task
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

SECRET = "tools-secret-for-the-test"


class Grader:
    """A stand-in for the server's `tools/answer` route: replies with the statuses given, then 200."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.bodies: list[bytes] = []

    async def answer(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {SECRET}"
        self.bodies.append(await request.read())
        if self.statuses:
            return web.json_response({"error": "busy"}, status=self.statuses.pop(0))
        return web.json_response({"ok": True, "message": "answer recorded"})

    async def serve(self, port: int = 0) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/rollout/r/v1/tools/answer", self.answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner


async def run_answer(tmp_path: Path, port: int, *, deadline_s: float, value: str = "42") -> tuple[int, str, str]:
    command = write_answer_command(tmp_path, base_url=f"http://127.0.0.1:{port}/rollout/r/v1", tools_secret=SECRET,
                                   deadline_s=deadline_s)
    process = await asyncio.create_subprocess_exec(str(command), value, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    return process.returncode, out.decode(), err.decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_answer_waits_for_a_server_that_is_not_listening_yet(tmp_path):
    grader, port = Grader(), free_port()
    answering = asyncio.create_task(run_answer(tmp_path, port, deadline_s=60))
    await asyncio.sleep(1.5)  # the command meets refused connections first
    assert not answering.done()
    site = await grader.serve(port)
    try:
        code, out, err = await answering
    finally:
        await site.cleanup()
    assert (code, out.strip()) == (0, "answer recorded"), err
    assert grader.bodies == [b'{"answer": "42"}']


async def test_answer_retries_a_busy_server_with_the_same_submission(tmp_path):
    grader = Grader(503, 429, 502)
    site = await grader.serve()
    try:
        code, out, err = await run_answer(tmp_path, site.addresses[0][1], deadline_s=60)
    finally:
        await site.cleanup()
    assert (code, out.strip()) == (0, "answer recorded"), err
    assert grader.bodies == [b'{"answer": "42"}'] * 4  # one submission, sent again: the server keeps the last


async def test_answer_refused_by_the_server_is_not_retried(tmp_path):
    grader = Grader(400)
    site = await grader.serve()
    try:
        code, _, err = await run_answer(tmp_path, site.addresses[0][1], deadline_s=60)
    finally:
        await site.cleanup()
    assert code == 1 and "answer was not accepted" in err
    assert len(grader.bodies) == 1


async def test_answer_gives_up_only_at_the_rollouts_limit(tmp_path):
    grader = Grader(*[503] * 1000)
    site = await grader.serve()
    try:
        code, _, err = await run_answer(tmp_path, site.addresses[0][1], deadline_s=2)
    finally:
        await site.cleanup()
    assert code == 75 and "before the rollout's limit" in err
    assert len(grader.bodies) >= 2  # it tried again before the limit


# ----------------------------------------------------------------------------------------------- the runner's view


def task() -> Task:
    return Task.from_dict({"id": "submit-5", "instruction": "Submit 5.",
                           "grader": {"kind": "answer", "expected": "5", "match": "numeric"},
                           "limits": {"wall_s": 60, "idle_s": 30}}, base_dir=Path("."))


def impatient_agent(wait_after_s: float, status: int = 1) -> CommandAgent:
    """An agent whose own call to `answer` gives up after a second, then exits with `status`, `wait_after_s`
    later."""
    script = ('curl -s --max-time 1 -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" '
              f'-d \'{{"answer": "5"}}\' "$OPENAI_BASE_URL/tools/answer" || {{ sleep {wait_after_s}; exit {status}; }}')
    return CommandAgent(argv=("sh", "-c", script))


@pytest.fixture
async def slow_server(scripted, tiny_model_dir, tmp_path):
    """A server whose `answer` takes 3 s to answer: longer than the impatient agent waits."""

    async def slow_answer(rollout, body: dict) -> dict:
        await asyncio.sleep(3)
        rollout.answer, rollout.answered = body.get("answer"), True
        return {"ok": True, "message": "answer recorded"}

    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          record_path=tmp_path / "rollouts.jsonl")
    async with InterceptionServer(config, host_tools={"answer": slow_answer}) as server:
        yield server


@pytest.mark.parametrize(("wait_after_s", "status"), [(0, 1), (4, 1), (0, 0)],
                         ids=["fails-while-answered", "fails-after-the-reply-is-lost", "carries-on-unanswered"])
async def test_an_agent_that_gave_up_on_a_slow_server_is_an_overload_not_a_failure_or_a_zero(slow_server,
                                                                                              wait_after_s, status):
    agent = impatient_agent(wait_after_s, status)
    (record,) = await Runner(slow_server, RunnerConfig(agent=agent)).run_tasks([task()])
    assert record.status == "failed" and record.failure.cause == "overload", record.failure
    assert record.reward is None
    if wait_after_s:
        assert [e["tool"] for e in record.events if e["kind"] == "reply_lost"] == ["answer"]


async def test_an_answer_recorded_whose_reply_was_lost_is_graded(slow_server):
    (record,) = await Runner(slow_server, RunnerConfig(agent=impatient_agent(4, status=0))).run_tasks([task()])
    assert (record.status, record.reward) == ("ok", 1.0)  # the server has the answer: the lost reply cost nothing


async def test_an_agent_that_fails_on_its_own_is_still_the_agents_failure(slow_server):
    crashing = CommandAgent(argv=(sys.executable, "-c", "import sys; sys.exit(3)"))
    (record,) = await Runner(slow_server, RunnerConfig(agent=crashing)).run_tasks([task()])
    assert record.status == "failed" and record.failure.cause == "agent"


async def test_every_rollout_records_how_long_it_waited_to_be_admitted(slow_server, scripted):
    scripted.default_reply = "Nothing to do."
    quick = CommandAgent(argv=("sh", "-c", "sleep 0.5"))
    records = await Runner(slow_server, RunnerConfig(agent=quick, concurrency=1)).run_group(task(), n=3)
    waits = sorted(next(e["waited_s"] for e in r.events if e["kind"] == "admitted") for r in records)
    assert waits[0] < waits[1] < waits[2]  # one slot: the second waited for the first, the third for both
    assert waits[2] >= 1.0  # at least the two agents' half seconds ahead of it
