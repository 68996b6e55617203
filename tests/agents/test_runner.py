"""The runner end to end with a real agent program (examples/agents/simple_agent.py, the OpenAI SDK) against the
server and a scripted policy: the tool the model called runs in the workspace, the answer is graded on the host,
and every way a rollout can go wrong ends with its cause and no reward."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import CommandAgent, PiAgent
from agents.runner import Runner, RunnerConfig
from agents.tasks import Task
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from tests.fakes import Fault, Slow
from tests.invariants import assert_token_exact

AGENT = CommandAgent(argv=(sys.executable, str(Path("examples/agents/simple_agent.py").resolve())))


def bash_call(command: str) -> str:
    return '<tool_call>\n{"name": "bash", "arguments": {"command": "%s"}}\n</tool_call>' % command


def task(**overrides) -> Task:
    data = {
        "id": "submit-5",
        "instruction": "Submit the answer 5 by running: answer 5",
        "grader": {"kind": "answer", "expected": "5", "match": "numeric"},
        "limits": {"wall_s": 60, "idle_s": 30},
        **overrides,
    }
    return Task.from_dict(data, base_dir=Path("."))


@pytest.fixture
async def server(scripted, tiny_model_dir, tmp_path):
    config = ServerConfig(
        upstream=UpstreamConfig(base_url=scripted.url, attempts=1, request_timeout_s=20),
        model_dir=tiny_model_dir,
        record_path=tmp_path / "rollouts.jsonl",
    )
    async with InterceptionServer(config) as server:
        yield server


async def test_agent_runs_the_tool_the_model_called_and_is_graded_on_the_host(server, scripted, tmp_path):
    scripted.script(bash_call("env > seen_env.txt; answer 5"), "Submitted.")
    records = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([task()], n=1)
    (record,) = records
    assert record.status == "ok", record.failure
    assert record.reward == 1.0 and record.answer == "5"
    assert [len(s.turns) for s in record.samples] == [2]
    second_prompt = scripted.tokenizer.decode(scripted.calls[1].prompt_ids)
    assert "answer recorded" in second_prompt  # the tool's output went back to the model
    assert_token_exact(record, scripted.calls)
    assert (tmp_path / "rollouts.jsonl").read_text().count(record.rollout_id) == 1


async def test_rollouts_of_a_runner_under_async_with_start_from_its_warm_pool_and_stay_token_exact(server, scripted):
    import asyncio

    from agents.sandbox.pool import PoolConfig

    scripted.script(*([bash_call("answer 5"), "Submitted."] * 3))
    async with Runner(server, RunnerConfig(agent=AGENT, concurrency=1, pool=PoolConfig(size=1))) as runner:
        records = []
        for i in range(3):
            async with asyncio.timeout(30):  # the pool refills in the background: wait for it, then take
                while not runner.pool.ready(runner.default_kind):
                    await asyncio.sleep(0.02)
            records.append(await runner.run_rollout(task(id=f"t{i}")))
        assert (runner.pool.taken_warm, runner.pool.taken_cold) == (3, 0)
    assert [(r.status, r.reward) for r in records] == [("ok", 1.0)] * 3
    for record, calls in zip(records, (scripted.calls[0:2], scripted.calls[2:4], scripted.calls[4:6]), strict=True):
        assert_token_exact(record, calls)


async def test_wrong_answer_is_reward_zero(server, scripted):
    scripted.script(bash_call("answer 6"), "Submitted.")
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([task()], n=1)
    assert record.status == "ok" and record.reward == 0.0


async def test_group_of_n_runs_n_rollouts_of_the_task(server, scripted):
    scripted.default_reply = "I will not use tools."
    records = await Runner(server, RunnerConfig(agent=AGENT, concurrency=2)).run_group(task(), n=3)
    assert len({r.rollout_id for r in records}) == 3
    assert all(r.status == "ok" and r.reward == 0.0 and r.metadata["task_id"] == "submit-5" for r in records)


async def test_upstream_down_fails_the_rollout_without_a_reward(server, scripted):
    scripted.script(*[Fault(500)] * 20)
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([task()], n=1)
    assert record.status == "failed" and record.failure.cause in ("upstream", "agent")
    assert record.reward is None


async def test_agent_that_hangs_without_requests_hits_the_idle_watchdog(server):
    hanging = CommandAgent(argv=(sys.executable, "-c", "import time; time.sleep(60)"))
    quick = task(limits={"wall_s": 60, "idle_s": 1.0})
    (record,) = await Runner(server, RunnerConfig(agent=hanging)).run_tasks([quick], n=1)
    assert record.status == "timeout" and record.failure.cause == "idle"
    assert record.reward is None


async def test_slow_generation_is_not_mistaken_for_an_idle_agent(server, scripted):
    scripted.script(Slow(bash_call("answer 5"), delay_s=8), "Submitted.")
    quick = task(limits={"wall_s": 60, "idle_s": 4})  # room for the agent's start-up; the generation takes twice that
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([quick], n=1)
    assert record.status == "ok" and record.reward == 1.0


async def test_crashing_agent_is_a_failure_with_its_output(server):
    crashing = CommandAgent(argv=(sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"))
    (record,) = await Runner(server, RunnerConfig(agent=crashing)).run_tasks([task()], n=1)
    assert record.status == "failed" and record.failure.cause == "agent"
    assert "status 3" in record.failure.message and "boom" in record.failure.message


async def test_missing_agent_binary_is_a_clear_failure(server):
    missing = PiAgent(binary=Path("/nonexistent/pi"))
    (record,) = await Runner(server, RunnerConfig(agent=missing)).run_tasks([task()], n=1)
    assert record.status == "failed" and record.failure.cause == "agent"
    assert "pi" in record.failure.message.lower()


async def test_grader_failure_is_a_failure_not_a_zero(server, scripted):
    scripted.script(bash_call("answer 5"), "Submitted.")
    broken = task(grader={"kind": "command", "command": "sleep 5", "timeout_s": 0.2})
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([broken], n=1)
    assert record.status == "failed" and record.failure.cause == "grader" and record.reward is None


async def test_failed_setup_is_a_sandbox_failure(server):
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([task(setup=["exit 7"])], n=1)
    assert record.status == "failed" and record.failure.cause == "sandbox"


async def test_setup_and_grading_run_inside_the_default_sandbox(server, scripted):
    from agents.sandbox.namespace import namespaces_unavailable

    if reason := namespaces_unavailable():
        pytest.skip(reason)
    inside = 'test "$(cat /proc/1/comm)" = bwrap'  # PID 1 of the sandbox's own PID namespace
    graded_inside = task(
        setup=[f"{inside} && echo yes > setup_was_inside"],
        grader={"kind": "command", "command": f"{inside} && test -s setup_was_inside"},
    )
    scripted.script("Nothing to do.")
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([graded_inside], n=1)
    assert record.status == "ok" and record.reward == 1.0, (record.failure, record.events)


async def test_the_same_grader_on_the_host_sees_the_host(server, scripted):
    from agents import LocalSandbox

    graded = task(grader={"kind": "command", "command": 'test "$(cat /proc/1/comm)" = bwrap'})
    scripted.script("Nothing to do.")
    (record,) = await Runner(server, RunnerConfig(agent=AGENT, sandbox=LocalSandbox)).run_tasks([graded], n=1)
    assert record.status == "ok" and record.reward == 0.0


async def test_a_sandbox_backend_that_keeps_failing_is_paused_instead_of_burning_every_rollout(server, scripted):
    from agents import AgentError, LocalSandbox
    from agents.sandbox.breaker import BreakerConfig

    runner: Runner | None = None

    class DownUntilTheCircuitOpens(LocalSandbox):
        """A backend that is down until the breaker has tripped once (then it has 'recovered')."""

        async def __aenter__(self):
            if runner.breaker.times_opened == 0:
                raise AgentError("the backend is down")
            return await super().__aenter__()

    config = RunnerConfig(agent=AGENT, sandbox=DownUntilTheCircuitOpens, concurrency=1,
                          breaker=BreakerConfig(threshold=2, cooldown_s=0.2))
    runner = Runner(server, config)
    scripted.script(*([bash_call("answer 5"), "Done."] * 3))
    records = await runner.run_tasks([task(id=f"t{i}") for i in range(5)], n=1)

    failed = [r for r in records if r.status == "failed"]
    assert [r.failure.cause for r in failed] == ["sandbox", "sandbox"]  # the threshold, not all five
    assert [r.reward for r in records if r.status == "ok"] == [1.0, 1.0, 1.0]
    assert any(e["kind"] == "sandbox_circuit_waited" for r in records for e in r.events)


async def test_a_rollout_in_the_default_sandbox_cannot_read_the_records_of_the_others(scripted, tiny_model_dir):
    import tempfile

    from agents.sandbox.namespace import namespaces_unavailable

    if reason := namespaces_unavailable():
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as records:  # outside /tmp, which sandboxes never see
        record_path = Path(records) / "rollouts.jsonl"
        config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url, attempts=1),
                              model_dir=tiny_model_dir, record_path=record_path)
        async with InterceptionServer(config) as server:
            server.open_rollout()  # a live rollout: its turns go to the journal beside the records
            peek = CommandAgent(argv=("/bin/sh", "-c", f"cat {record_path}* > seen.txt 2>/dev/null; exit 0"))
            graded = task(grader={"kind": "command", "command": "test -s seen.txt"})
            (record,) = await Runner(server, RunnerConfig(agent=peek)).run_tasks([graded], n=1)
            assert list(Path(records).glob("rollouts.jsonl.journal.*")), "the journal is there on the host"
    assert record.status == "ok" and record.reward == 0.0  # seen.txt is empty: the records were not visible


async def test_a_task_whose_image_cannot_run_fails_with_cause_sandbox_and_is_never_run_elsewhere(server, scripted):
    imaged = task(image="interceptor/no-such-image:never")
    (record,) = await Runner(server, RunnerConfig(agent=AGENT)).run_tasks([imaged], n=1)
    assert record.status == "failed" and record.failure.cause == "sandbox" and record.reward is None
    assert scripted.calls == []  # the agent never started


@pytest.mark.parametrize("network", ["model", "open"])
async def test_only_a_task_that_opens_the_network_reaches_other_host_ports(server, scripted, network):
    import asyncio as aio

    from agents.sandbox.namespace import namespaces_unavailable

    if reason := namespaces_unavailable():
        pytest.skip(reason)
    listener = await aio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    probe = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=3).close()\n"
             "    open('reached', 'w').write('yes')\nexcept OSError:\n    pass\n") % port
    agent = CommandAgent(argv=(sys.executable, "-c", probe))
    reaching = task(network=network, grader={"kind": "command", "command": "test -s reached"})
    async with listener:
        (record,) = await Runner(server, RunnerConfig(agent=agent)).run_tasks([reaching], n=1)
    assert record.status == "ok" and record.reward == (1.0 if network == "open" else 0.0)
