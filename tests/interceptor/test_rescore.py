"""`interceptor rescore`: a run recorded through the interception server on the real local engine, scored again by
the same weights (the gap is rounding), by another model (the gap is large), and by a stub server that fails in the
ways a policy server can (only those faults are stubbed)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from interceptor import InterceptionServer, SamplingSettings, ServerConfig, UpstreamConfig, read_records
from interceptor.cli import main
from interceptor.store.records import RolloutRecord
from interceptor.tools.rescore import RescoreConfig, RescoreError, rescore
from trainer.engine import EngineConfig, LocalEngine
from trainer.models.tiny_model import TinyModelSpec, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS, TURNS = 3, 2


async def _chat(http: aiohttp.ClientSession, handle, messages: list[dict]) -> dict:
    async with http.post(handle.base_url + "/chat/completions", json={"model": "policy", "messages": messages},
                         headers={"Authorization": f"Bearer {handle.secret}"}) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["choices"][0]["message"]


async def _record_run(model_dir: Path, record_path: Path) -> None:
    """A few multi-turn rollouts of different lengths, sampled at temperature 1 by the local engine through the
    interception gate; the last one also restarts the conversation, which forks a second sample."""
    async with LocalEngine(EngineConfig(model=model_dir, port=0, served_model_name="tiny")) as engine:
        config = ServerConfig(upstream=UpstreamConfig(base_url=engine.base_url), model_dir=model_dir,
                              record_path=record_path)
        async with InterceptionServer(config) as server, aiohttp.ClientSession() as http:
            for n in range(ROLLOUTS):
                sampling = SamplingSettings(temperature=1.0, seed=100 + n, max_tokens=8 + 4 * n)
                handle = server.open_rollout(sampling=sampling)
                messages = [{"role": "user", "content": f"Task {n}: describe the weather" + " today" * n + "."}]
                for turn in range(TURNS):
                    reply = await _chat(http, handle, messages)
                    messages += [{"role": "assistant", "content": reply["content"] or ""},
                                 {"role": "user", "content": f"And step {turn + 1}?"}]
                if n == ROLLOUTS - 1:
                    await _chat(http, handle, [{"role": "user", "content": "Start again."}])
                await server.finish_rollout(handle.id)


@pytest.fixture(scope="module")
def run_file(tiny_model_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rescore") / "rollouts.jsonl"
    asyncio.run(_record_run(tiny_model_dir, path))
    return path


@pytest.fixture(scope="module")
def records(run_file) -> list[RolloutRecord]:
    return list(read_records(run_file))


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory) -> Path:
    """Another random model of the same shape and tokenizer: a policy that has drifted as far as it can."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-seed1", TinyModelSpec(seed=1))


def _sampled(records: list[RolloutRecord]) -> int:
    return sum(s.completion_tokens for r in records for s in r.samples)


async def test_the_same_weights_score_the_recorded_tokens_to_rounding(tiny_model_dir, records):
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        report = await rescore(records, RescoreConfig(upstream=engine.base_url + "/v1", concurrency=2))
    assert report.model == "tiny" and report.skipped == ()
    assert report.overall.tokens == _sampled(records) > 0
    assert {r.rollout_id for r in report.rollouts} == {r.rollout_id for r in records} and len(report.rollouts) == 3
    assert sum(r.samples for r in report.rollouts) == sum(len(r.samples) for r in records) == ROLLOUTS + 1
    assert sum(r.stats.tokens for r in report.rollouts) == report.overall.tokens
    print(f"same weights: max gap {report.overall.max:.3g}, mean {report.overall.mean:.3g}")
    assert report.overall.max <= 1e-4
    assert report.worst and report.worst[0].gap == report.overall.max


async def test_a_policy_version_rescores_only_the_samples_it_sampled(tiny_model_dir, records):
    """A training run's records hold samples of several policy versions and the server holds one: `policy_version`
    keeps the samples every turn of which that version sampled."""
    import dataclasses

    later = records[0]  # as if the engine had been given new weights before this rollout
    relabelled = dataclasses.replace(later, samples=[
        dataclasses.replace(s, turns=[dataclasses.replace(t, policy_version=1) for t in s.turns]) for s in later.samples
    ])
    mixed = [relabelled, *records[1:]]
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        first = await rescore(mixed, RescoreConfig(upstream=engine.base_url, policy_version=0))
        second = await rescore(mixed, RescoreConfig(upstream=engine.base_url, policy_version=1))
        with pytest.raises(RescoreError, match="sampled at policy version 2"):
            await rescore(mixed, RescoreConfig(upstream=engine.base_url, policy_version=2))
    assert {r.rollout_id for r in first.rollouts} == {r.rollout_id for r in records[1:]}
    assert first.overall.tokens == _sampled(records[1:])
    assert [r.rollout_id for r in second.rollouts] == [later.rollout_id] and second.overall.tokens == _sampled([later])


async def test_a_turn_that_spans_a_weight_sync_is_skipped_with_the_reason_under_a_policy_version(
        tiny_model_dir, records):
    """A generation paused by a sync and finished on the new weights holds two versions under its start's stamp: no
    one server can score it, so `policy_version` lists it as skipped instead of reporting its tail as a gap."""
    import dataclasses

    spanning = records[0]
    marked = dataclasses.replace(spanning, samples=[
        dataclasses.replace(s, turns=[dataclasses.replace(t, spans_sync=True) for t in s.turns[:1]] + s.turns[1:])
        for s in spanning.samples
    ])
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        report = await rescore([marked, *records[1:]], RescoreConfig(upstream=engine.base_url, policy_version=0))
    assert {r.rollout_id for r in report.rollouts} == {r.rollout_id for r in records[1:]}
    assert [(s.rollout_id, s.reason) for s in report.skipped] == [
        (spanning.rollout_id, "turn 0 spans a weight sync: its tail may be a later version's than 0")
    ] * len(spanning.samples)


async def test_another_model_shows_a_large_gap_at_the_worst_positions(other_model_dir, records):
    async with LocalEngine(EngineConfig(model=other_model_dir, port=0, served_model_name="drifted")) as engine:
        report = await rescore(records, RescoreConfig(upstream=engine.base_url, model="drifted", worst=5))
    overall = report.overall
    print(f"other model: mean gap {overall.mean:.3g}, p99 {overall.p99:.3g}, max {overall.max:.3g}")
    assert report.overall.tokens == _sampled(records)
    assert report.overall.mean > 0.05 and report.overall.max > 0.5
    assert report.overall.p50 <= report.overall.p99 <= report.overall.max
    assert len(report.worst) == 5 and [g.gap for g in report.worst] == sorted((g.gap for g in report.worst),
                                                                              reverse=True)
    by_id = {r.rollout_id: r for r in records}
    for gap in report.worst:  # each names a sampled token of the records, with its recorded logprob
        sample = by_id[gap.rollout_id].samples[gap.sample]
        assert sample.completion_mask[gap.index] == 1 and sample.input_ids[gap.index] == gap.token_id
        assert sample.old_logprobs[gap.index] == gap.recorded
        assert gap.gap == pytest.approx(abs(gap.rescored - gap.recorded))


async def test_samples_longer_than_the_servers_context_are_skipped_with_the_reason(tiny_model_dir, records):
    longest = max(len(s.input_ids) for r in records for s in r.samples)
    config = EngineConfig(model=tiny_model_dir, port=0, max_model_len=longest)  # no room for the 1 token to generate
    async with LocalEngine(config) as engine:
        report = await rescore(records, RescoreConfig(upstream=engine.base_url))
    too_long = {(r.rollout_id, s.index) for r in records for s in r.samples if len(s.input_ids) == longest}
    assert {(s.rollout_id, s.sample) for s in report.skipped} == too_long
    assert all("max_model_len" in s.reason and s.tokens == longest for s in report.skipped)
    assert 0 < report.overall.tokens == _sampled(records) - sum(
        s.completion_tokens for r in records for s in r.samples if (r.rollout_id, s.index) in too_long)


# ----------------------------------------------------------------------------------------------- faults


class StubPolicy:
    """A real server on port 0 answering /v1/completions as told: `reply(body) -> (status, json)`."""

    def __init__(self, reply, *, max_model_len: int | None = 4096) -> None:
        self.reply = reply
        self.max_model_len = max_model_len
        self.authorizations: list[str | None] = []
        self.url = ""

    async def __aenter__(self) -> StubPolicy:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": "stub", "object": "model"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [card]})

    async def _completions(self, request: web.Request) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization"))
        status, body = self.reply(await request.json())
        return web.json_response(body, status=status)


def _scored_at(logprob: float):
    """A well-formed vLLM reply giving every prompt token `logprob`."""
    def reply(body: dict) -> tuple[int, dict]:
        entries = [None] + [{str(t): {"logprob": logprob, "rank": 1, "decoded_token": "x"}} for t in body["prompt"][1:]]
        return 200, {"choices": [{"index": 0, "text": "x", "prompt_logprobs": entries}]}
    return reply


def _first(records: list[RolloutRecord]) -> str:
    return f"rollout {records[0].rollout_id} sample 0"


async def test_an_upstream_error_names_the_sample_and_the_status(records):
    error = {"error": {"message": "the engine fell over", "type": "server_error", "code": 500}}
    async with StubPolicy(lambda body: (500, error)) as stub:
        with pytest.raises(RescoreError, match=rf"{_first(records)}: the policy server answered 500: the engine fell"):
            await rescore(records[:1], RescoreConfig(upstream=stub.url, concurrency=1))


async def test_a_reply_without_prompt_logprobs_is_an_error_naming_the_sample(records):
    reply = {"choices": [{"index": 0, "text": "x", "prompt_logprobs": None}]}
    async with StubPolicy(lambda body: (200, reply)) as stub:
        with pytest.raises(RescoreError, match=rf"{_first(records)}: the policy server answered 200 without prompt_"):
            await rescore(records[:1], RescoreConfig(upstream=stub.url, concurrency=1))


async def test_a_context_length_refusal_skips_the_sample_when_the_server_does_not_list_its_length(records):
    refusal = {"error": {"message": "You passed 99 input tokens and requested 1 output tokens. However, the model's "
                                    "context length is only 64 tokens", "type": "BadRequestError", "code": 400}}
    async with StubPolicy(lambda body: (400, refusal), max_model_len=None) as stub:
        report = await rescore(records[:1], RescoreConfig(upstream=stub.url))
    assert len(report.skipped) == len(records[0].samples) and report.overall.tokens == 0
    assert "context length is only 64 tokens" in report.skipped[0].reason


async def test_the_api_key_is_sent_as_a_bearer_token(records):
    async with StubPolicy(_scored_at(-1.0)) as stub:
        report = await rescore(records[:1], RescoreConfig(upstream=stub.url, api_key="sk-remote"))
    assert set(stub.authorizations) == {"Bearer sk-remote"}
    assert report.model == "stub" and report.overall.tokens == sum(s.completion_tokens for s in records[0].samples)


async def test_records_without_samples_are_refused():
    with pytest.raises(RescoreError, match="no sample with sampled tokens"):
        await rescore([], RescoreConfig(upstream="http://127.0.0.1:9"))


# ----------------------------------------------------------------------------------------------- command line


@pytest.mark.parametrize("problem", ["missing file", "empty file", "bad url", "zero timeout"])
def test_unusable_inputs_exit_2_with_a_message(problem, run_file, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    argv = {
        "missing file": [str(tmp_path / "absent.jsonl"), "--upstream", "http://127.0.0.1:9"],
        "empty file": [str(empty), "--upstream", "http://127.0.0.1:9"],
        "bad url": [str(run_file), "--upstream", "127.0.0.1:8000"],
        "zero timeout": [str(run_file), "--upstream", "http://127.0.0.1:9", "--timeout", "0"],
    }[problem]
    assert main(["rescore", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("interceptor rescore: error:") and "Traceback" not in error


async def _cli(*argv: str, env: dict | None = None) -> tuple[int, str, str]:
    """The command in a subprocess, while this event loop keeps serving the policy server it talks to."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "interceptor.cli", "rescore", *argv, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode, out.decode(), err.decode()


async def test_the_command_prints_the_table_and_writes_json(tiny_model_dir, run_file, records, tmp_path):
    out = tmp_path / "report.json"
    async with LocalEngine(EngineConfig(model=tiny_model_dir, port=0, served_model_name="tiny")) as engine:
        code, stdout, stderr = await _cli(str(run_file), "--upstream", engine.base_url, "--json", str(out))
    assert code == 0, stderr
    assert "rollout" in stdout and "p99" in stdout and "worst positions:" in stdout
    assert all(r.rollout_id in stdout for r in records)
    overall = next(line for line in stdout.splitlines() if line.startswith("all "))
    assert overall.split()[2] == str(_sampled(records))
    report = json.loads(out.read_text())
    assert report["model"] == "tiny" and report["overall"]["tokens"] == _sampled(records)
    assert report["overall"]["max"] <= 1e-4 and len(report["rollouts"]) == ROLLOUTS


async def test_the_command_reads_the_api_key_from_the_environment_and_exits_1_on_upstream_errors(run_file):

    env = {**os.environ, "INTERCEPTOR_UPSTREAM_API_KEY": "sk-from-env"}
    async with StubPolicy(lambda body: (503, {"error": {"message": "overloaded"}})) as stub:
        code, stdout, stderr = await _cli(str(run_file), "--upstream", stub.url, "--concurrency", "1", env=env)
    assert code == 1 and stdout == ""
    assert "the policy server answered 503: overloaded" in stderr and "Traceback" not in stderr
    assert stub.authorizations and set(stub.authorizations) == {"Bearer sk-from-env"}
