"""The record file reads back into the same types, and `interceptor inspect` summarises and shows it."""

from __future__ import annotations

from openai import AsyncOpenAI

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig, read_records
from interceptor.cli import main
from tests.interceptor.test_trajectories import TOOLS, call_text, echo


async def test_record_file_round_trips_and_inspect_shows_spans(scripted, tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, record_path=path)
    async with InterceptionServer(config) as server:
        handle = server.open_rollout(metadata={"task": "t1"})
        scripted.script(call_text("ls"), "finished")
        async with AsyncOpenAI(base_url=handle.base_url, api_key=handle.secret) as client:
            messages = [{"role": "user", "content": "go"}]
            reply = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
            messages += [echo(reply.choices[0].message)]
            messages.append({"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id, "content": "x"})
            await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        written = await server.finish_rollout(handle.id)
        failed = server.open_rollout()
        await server.finish_rollout(failed.id, status="timeout")

    records = list(read_records(path))
    assert records[0] == written
    assert [r.status for r in records] == ["ok", "timeout"]

    assert main(["inspect", str(path)]) == 0
    summary = capsys.readouterr().out
    assert "rollouts: 2" in summary and "'timeout': 1" in summary and "turns: 2" in summary
    assert "chains_by_kind: {'main': 1}" in summary  # the timed-out rollout made no call

    assert main(["inspect", str(path), "--rollout", handle.id, "--model", str(tiny_model_dir)]) == 0
    shown = capsys.readouterr().out
    assert "[sampled" in shown and "[prompt" in shown and "finished<|im_end|>" in shown
    assert "-- sample 0: " in shown and " main" in shown.split("-- sample 0: ")[1].splitlines()[0]
