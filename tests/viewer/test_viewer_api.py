"""The viewer's HTTP API on a real server (port 0): the table, one rollout at the token level, its fork tree, live
events when the files grow, errors in one JSON shape, the token guard, and the viewer mounted on another app."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson
import pytest
from aiohttp import web

from interceptor.store.recorder import Recorder
from interceptor.store.records import Failure
from interceptor.viewer.detail import TokenText
from interceptor.viewer.main import mount_viewer, open_viewer

from .records import make_record


@contextlib.asynccontextmanager
async def serving(app: web.Application):
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # unsafe: keep cookies for an IP address, as a browser does
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", cookie_jar=jar) as client:
            yield client
    finally:
        await runner.cleanup()


async def write(path, *records) -> None:
    recorder = Recorder(path)
    for record in records:
        await recorder.write(record)


@pytest.fixture
async def run_dir(tmp_path):
    await write(tmp_path / "rollouts.jsonl",
                make_record("r-ok", reward=1.0, samples=[(False, None), (False, "history rewritten"), (True, None)]),
                make_record("r-failed", status="failed", reward=None,
                            failure=Failure(cause="upstream", message="the policy server answered 503")))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "sample/staleness_mean": 0.0}\n')
    return tmp_path


async def test_the_table_and_the_summary_answer_from_the_records(run_dir):
    async with serving(open_viewer(run_dir, poll_s=0.05)) as client:
        async with client.get("/api/run") as response:
            run = await response.json()
        assert run["rollouts"] == 2 and run["by_status"] == {"ok": 1, "failed": 1}
        assert run["failures_by_cause"] == {"upstream": 1} and run["forks"] == 1 and run["auxiliary"] == 1
        assert run["curves"]["reward"] == [[1, 0.5]]
        async with client.get("/api/rollouts", params={"status": "failed"}) as response:
            table = await response.json()
        assert [row["rollout_id"] for row in table["rows"]] == ["r-failed"] and table["total"] == 1
        async with client.get("/") as response:
            assert response.status == 200 and "run viewer" in await response.text()
        async with client.get("/static/viewer.js") as response:
            assert response.status == 200


async def test_a_rollout_shows_prompt_and_sampled_tokens_with_logprobs_and_its_tree(run_dir, tiny_model_dir):
    app = open_viewer(run_dir, model=tiny_model_dir, poll_s=0.05)
    async with serving(app) as client:
        async with client.get("/api/rollouts/r-ok") as response:
            detail = await response.json()
    record = orjson.loads((run_dir / "rollouts.jsonl").read_bytes().splitlines()[0])
    assert detail["tokenizer"] is True and detail["reward"] == 1.0
    text = TokenText.load(tiny_model_dir)
    for shown, sample in zip(detail["samples"], record["samples"]):
        sampled = [t for span in shown["spans"] if span["kind"] == "sampled" for t in span["tokens"]]
        expected = [(i, lp) for i, lp, m in zip(sample["input_ids"], sample["old_logprobs"], sample["completion_mask"])
                    if m]
        assert [(t["id"], t["logprob"]) for t in sampled] == expected  # every sampled token, its own logprob
        assert all(t["text"] == text.token(t["id"]) for t in sampled)
        prompt_ids = [sample["input_ids"][span["start"]:span["end"]]
                      for span in shown["spans"] if span["kind"] == "prompt"]
        assert [text.text(ids) for ids in prompt_ids] == [s["text"] for s in shown["spans"] if s["kind"] == "prompt"]
        spans = shown["spans"]  # spans tile the sample, in order, at the turn boundaries
        assert spans[0]["start"] == 0 and spans[-1]["end"] == len(sample["input_ids"])
        assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:]))
        boundaries = [(t["completion_start"], t["completion_end"]) for t in sample["turns"]]
        assert [(s["start"], s["end"]) for s in spans if s["kind"] == "sampled"] == boundaries
        stamps = [(t["policy_version"], t["spans_sync"]) for t in sample["turns"]]
        assert [(s["policy_version"], s["spans_sync"]) for s in spans if s["kind"] == "sampled"] == stamps
        assert (0, True) in stamps  # a turn that ran across a weight sync says so
    tree = {node["sample"]: node for node in detail["tree"]}
    assert tree[0]["parent"] is None
    assert tree[1]["parent"] == 0 and tree[1]["shared_tokens"] == 8 and tree[1]["fork_reason"] == "history rewritten"
    assert tree[2]["auxiliary"] is True


async def test_errors_are_json_in_one_shape(run_dir):
    async with serving(open_viewer(run_dir, poll_s=0.05)) as client:
        for path, params, status, words in [
            ("/api/rollouts/nope", {}, 404, "no rollout 'nope'"),
            ("/api/rollouts", {"limit": "5000"}, 400, "limit must be between"),
            ("/api/rollouts", {"sort": "x"}, 400, "sort must be one of"),
            ("/api/nothing", {}, 404, "is not an endpoint"),
        ]:
            async with client.get(path, params=params) as response:
                body = await response.json()
            assert response.status == status, path
            assert words in body["error"]["message"]


async def test_events_announce_records_and_steps_as_they_are_written(run_dir):
    async with serving(open_viewer(run_dir, poll_s=0.05)) as client:
        async with client.get("/api/events") as events:
            first = orjson.loads((await events.content.readline()).removeprefix(b"data: "))
            await events.content.readline()  # the blank line that ends an event
            assert first["rollouts"] == 2 and first["steps"] == 1
            await write(run_dir / "rollouts.jsonl", make_record("r-new"))
            async with asyncio.timeout(30):
                line = b""
                while not line.startswith(b"data: "):
                    line = await events.content.readline()
            update = orjson.loads(line.removeprefix(b"data: "))
            assert update["rollouts"] == 3 and update["version"] > first["version"]
        async with client.get("/api/rollouts", params={"q": "r-new"}) as response:
            assert (await response.json())["total"] == 1


async def test_with_a_token_the_viewer_wants_it_and_a_link_with_it_sets_a_cookie(run_dir):
    async with serving(open_viewer(run_dir, poll_s=0.05, token="s3cret")) as client:
        async with client.get("/api/run") as response:
            assert response.status == 401
            assert "token" in (await response.json())["error"]["message"]
        async with client.get("/api/run", headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        async with client.get("/", params={"token": "s3cret"}) as response:
            assert response.status == 200
        async with client.get("/api/run") as response:  # the cookie from the link
            assert response.status == 200


async def test_the_viewer_mounts_under_a_prefix_of_another_application(run_dir):
    host = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    host.router.add_get("/health", health)
    mount_viewer(host, open_viewer(run_dir, poll_s=0.05), "/view")
    async with serving(host) as client:
        async with client.get("/view", allow_redirects=False) as response:
            assert response.status == 302 and response.headers["Location"] == "/view/"
        async with client.get("/view/") as response:
            page = await response.text()
        assert 'src="static/viewer.js"' in page  # relative, so it resolves under the prefix
        async with client.get("/view/api/rollouts") as response:
            assert (await response.json())["total"] == 2
        async with client.get("/health") as response:
            assert response.status == 200
