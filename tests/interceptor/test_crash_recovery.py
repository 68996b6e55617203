"""`interceptor serve` survives its own death: a kill -9, a torn last line, a SIGTERM.

The server runs as a child process in front of a scripted upstream that answers slowly, so turns are in flight
when it dies. Every scripted reply carries a unique marker ("reply N" or a tool call running "echo N"), so each
reply an agent received can be traced to the one upstream call that produced it, and each recovered turn checked
against that call: the same prompt, the same sampled ids, the same logprobs.

The contract: every turn whose 200 an agent received is in the record file after a restart (the turn in flight at
the kill may or may not be); an unfinished rollout comes back as `status: "interrupted"` with no reward; a
finished rollout is neither lost nor written twice; a torn last line is skipped when reading and never glued to the
next record.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson

from interceptor import RolloutRecord, read_records
from interceptor.cli import main
from tests.fakes import Call, Slow
from tests.interceptor.serve_process import Conversation, ServeProcess
from tests.invariants import assert_token_exact

TEST_TIMEOUT_S = 240.0  # a bound on every wait below; the kill test takes ~20 s on 2 cores
ROLLOUTS = 32
FINISHED = 16  # rollouts finished over the admin API before the kill; the rest are mid-conversation
FINISHED_TURNS = 3
TURNS_BEFORE_KILL = 2  # every unfinished rollout has at least this many answered turns when the server dies
MAX_TURNS = 100  # an unfinished agent stops here if the kill never comes (the history stays far below 4096 tokens)
RECOVERY_TIMEOUT_S = 30.0  # for the restarted server to write what it recovered
REPLY_DELAY_S = (0.05, 0.3)  # upstream time per turn: most agents have a turn in flight at any moment
_MARKER = re.compile(r"(?:reply|echo) (\d+)")


def tool_call_text(cmd: str) -> str:
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"cmd": "{cmd}"}}}}\n</tool_call>'


def marked_replies(start: int, count: int, delay_s: Callable[[], float]) -> list[Slow]:
    """Replies with unique markers: a tool call two times in three, plain text otherwise."""
    texts = (f"reply {n}" if n % 3 == 0 else tool_call_text(f"echo {n}") for n in range(start, start + count))
    return [Slow(text, delay_s()) for text in texts]


def marker(text: str) -> int:
    found = _MARKER.search(text)
    assert found, f"no marker in {text!r}"
    return int(found.group(1))


def calls_by_marker(upstream, calls: list[Call]) -> dict[int, Call]:
    return {marker(upstream.tokenizer.decode(call.token_ids)): call for call in calls}


def assert_turns_recovered(record: RolloutRecord, replies: list[dict], calls: dict[int, Call]) -> int:
    """The record holds the turns whose replies the agent received, in order, each exactly as the upstream
    sampled it; at most one more (the turn in flight when the server died). Returns the turns recorded."""
    recorded = [(sample, turn) for sample in record.samples for turn in sample.turns]
    assert len(replies) <= len(recorded) <= len(replies) + 1, (
        f"{record.rollout_id}: {len(replies)} turns answered, {len(recorded)} recorded"
    )
    for number, (reply, (sample, turn)) in enumerate(zip(replies, recorded)):
        call = calls[marker(orjson.dumps(reply).decode())]
        start, end = turn.completion_start, turn.completion_end
        where = f"{record.rollout_id} turn {number}"
        assert sample.input_ids[:start] == call.prompt_ids, f"{where}: not the prompt the upstream saw"
        assert sample.input_ids[start:end] == call.token_ids, f"{where}: not the tokens the upstream returned"
        assert sample.completion_mask[start:end] == [1] * (end - start), where
        assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(sample.old_logprobs[start:end], call.logprobs))
    assert_token_exact(record, list(calls.values()))
    return len(recorded)


def assert_interrupted(record: RolloutRecord) -> None:
    assert record.status == "interrupted", f"{record.rollout_id}: {record.status}"
    assert record.failure is not None and record.failure.cause == "interrupted", record.failure
    assert record.reward is None


def read_by_id(path: Path) -> dict[str, RolloutRecord]:
    """The records, by rollout id; each id must appear once."""
    records = list(read_records(path))
    twice = [rid for rid, n in Counter(r.rollout_id for r in records).items() if n > 1]
    assert not twice, f"rollouts written more than once: {twice}"
    return {r.rollout_id: r for r in records}


async def wait_for_records(path: Path, ids: set[str], server: ServeProcess) -> None:
    """Recovery writes the interrupted records when the restarted server starts; poll until they are there."""
    present: set[str] = set()
    try:
        async with asyncio.timeout(RECOVERY_TIMEOUT_S):
            while not ids <= present:
                assert server.process.returncode is None, f"the server exited:\n{server.stderr_tail()}"
                await asyncio.sleep(0.1)
                present = {r.rollout_id for r in read_records(path)} if path.exists() else set()
    except TimeoutError:
        raise AssertionError(f"{len(ids - present)} of {len(ids)} rollouts missing after the restart") from None


async def talk(conversation: Conversation, session: aiohttp.ClientSession, turns: int) -> None:
    for _ in range(turns):
        await conversation.turn(session)


async def talk_until_the_server_dies(
    conversation: Conversation, session: aiohttp.ClientSession, turns: int = MAX_TURNS
) -> None:
    try:
        await talk(conversation, session, turns)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
        pass  # the server was killed: the turn in flight got no answer


async def test_kill_9_loses_no_finished_rollout_and_keeps_every_answered_turn(scripted, launch, record_path):
    rng = random.Random(0)
    scripted.script(*marked_replies(0, ROLLOUTS * MAX_TURNS, lambda: rng.uniform(*REPLY_DELAY_S)))
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            conversations = [Conversation(await server.open_rollout(session)) for _ in range(ROLLOUTS)]
            finishing, live = conversations[:FINISHED], conversations[FINISHED:]
            rewards = {c.rollout["id"]: round(0.1 + i / 100, 2) for i, c in enumerate(finishing)}

            async def finish(conversation: Conversation) -> dict:
                rollout_id = conversation.rollout["id"]
                await talk(conversation, session, FINISHED_TURNS)
                return await server.finish_rollout(session, rollout_id, reward=rewards[rollout_id])

            async with asyncio.TaskGroup() as agents:
                for conversation in live:
                    agents.create_task(talk_until_the_server_dies(conversation, session))
                acknowledged = await asyncio.gather(*(finish(c) for c in finishing))
                while min(len(c.replies) for c in live) < TURNS_BEFORE_KILL:
                    await asyncio.sleep(0.02)
                waiting = sum(c.waiting for c in live)
                await server.kill()
            # every agent has hit the dead server; an answer already in a socket buffer at the kill counts as received
        answered = sum(len(c.replies) for c in live)
        print(
            f"\nkill -9: {FINISHED} rollouts finished; {len(live)} live had {answered} turns answered "
            f"and {waiting} chat calls out"
        )

        assert [r["status"] for r in acknowledged] == ["ok"] * FINISHED
        async with launch() as server:
            await wait_for_records(record_path, {c.rollout["id"] for c in conversations}, server)
            assert await server.terminate() == 0, server.stderr_tail()

        records = read_by_id(record_path)
        calls = calls_by_marker(scripted, scripted.calls)
        assert set(records) == {c.rollout["id"] for c in conversations}
        for conversation in finishing:
            record = records[conversation.rollout["id"]]
            assert record.status == "ok" and record.reward == rewards[record.rollout_id]
            assert assert_turns_recovered(record, conversation.replies, calls) == FINISHED_TURNS
        recovered = 0
        for conversation in live:
            record = records[conversation.rollout["id"]]
            assert_interrupted(record)
            recovered += assert_turns_recovered(record, conversation.replies, calls)
        print(
            f"after the restart: {FINISHED} finished rollouts, 0 lost or doubled; {len(live)} interrupted with "
            f"{recovered} turns recovered of {answered} answered ({recovered - answered} in flight at the kill, kept)"
        )

        # recovery happens once: a second restart writes nothing again
        async with launch() as server:
            assert await server.terminate() == 0, server.stderr_tail()
        assert read_by_id(record_path) == records


async def test_a_torn_last_line_is_skipped_and_the_next_record_starts_on_a_fresh_line(
    scripted, launch, record_path, capsys
):
    scripted.script(*marked_replies(0, 20, lambda: 0.0))
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            earlier = []
            for reward in (0.25, 0.75):
                conversation = Conversation(await server.open_rollout(session))
                await talk(conversation, session, 2)
                earlier.append(await server.finish_rollout(session, conversation.rollout["id"], reward=reward))
            assert await server.terminate() == 0, server.stderr_tail()

        whole = record_path.read_bytes()
        first_line = whole.splitlines()[0]
        torn = first_line[: len(first_line) // 2]  # a write cut short: half a record, no newline
        with open(record_path, "ab") as f:
            f.write(torn)

        torn_lines: list[tuple[int, int]] = []
        readable = read_records(record_path, on_torn=lambda number, size: torn_lines.append((number, size)))
        assert [r.rollout_id for r in readable] == [r["rollout_id"] for r in earlier]
        assert torn_lines == [(3, len(torn))]  # (line number, bytes)
        assert main(["inspect", str(record_path)]) == 0  # the default report is a warning, not an error
        assert "rollouts: 2" in capsys.readouterr().out

        async with launch() as server:
            conversation = Conversation(await server.open_rollout(session))
            await talk(conversation, session, 1)
            latest = await server.finish_rollout(session, conversation.rollout["id"], reward=1.0)
            assert await server.terminate() == 0, server.stderr_tail()

    for line in record_path.read_bytes().splitlines():
        if line.strip() and line != torn:
            orjson.loads(line)  # a complete record on a line of its own, not glued to the fragment
    records = read_by_id(record_path)
    assert list(records) == [r["rollout_id"] for r in earlier] + [latest["rollout_id"]]
    assert records[latest["rollout_id"]].reward == 1.0 and records[latest["rollout_id"]].status == "ok"


async def test_sigterm_writes_live_rollouts_as_interrupted_with_their_samples(scripted, launch, record_path):
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        async with launch() as server:
            conversations = [Conversation(await server.open_rollout(session)) for _ in range(4)]
            scripted.script(*marked_replies(0, 2 * len(conversations), lambda: 0.0))
            await asyncio.gather(*(talk(c, session, 2) for c in conversations))
            # one more turn, in flight upstream when the signal comes (the graceful stop lets it finish)
            scripted.script(*marked_replies(100, 1, lambda: 1.0))
            in_flight = asyncio.create_task(talk_until_the_server_dies(conversations[0], session, turns=1))
            while scripted.replies:  # popped: the upstream has the request
                await asyncio.sleep(0.02)
            assert await server.terminate() == 0, server.stderr_tail()
            await in_flight

    records = read_by_id(record_path)
    calls = calls_by_marker(scripted, scripted.calls)
    assert set(records) == {c.rollout["id"] for c in conversations}
    for conversation in conversations:
        record = records[conversation.rollout["id"]]
        assert_interrupted(record)
        assert assert_turns_recovered(record, conversation.replies, calls) >= 2
