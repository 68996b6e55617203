"""The viewer's index reads what the recorder writes: a row per record equal to the record's own figures, lines
appended while it follows the file, nothing from a half-written line, and a file started again from the top."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from interceptor.store.recorder import Recorder
from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord
from interceptor.viewer.index import RecordIndex, summarise_line
from interceptor.viewer.query import RolloutQuery, page, run_summary

from .records import make_record


def _write(path, records) -> None:
    async def go() -> None:
        recorder = Recorder(path)
        for record in records:
            await recorder.write(record)

    asyncio.run(go())


def test_a_row_agrees_with_the_record_it_summarises(tmp_path):
    records = [
        make_record("a", reward=1.0, samples=[(False, None), (True, None), (False, "history rewritten")]),
        make_record("b", status="failed", failure=Failure(cause="upstream", message="503"), reward=None),
        # an answer holding the very bytes the fast path looks for: the row comes from a full parse, and is right
        make_record("c", reward=0.0, answer={"x": [1], "usage": {"turns": 99}, "schema": "nope"}),
    ]
    path = tmp_path / "rollouts.jsonl"
    _write(path, records)
    index = RecordIndex.open(path)
    assert [row.rollout_id for row in index.rows] == ["a", "b", "c"]
    for row, record in zip(index.rows, records):
        assert row.status == record.status
        assert row.reward == record.reward
        assert row.cause == (record.failure.cause if record.failure else None)
        assert row.samples == len(record.samples)
        assert row.forks == record.forks
        assert row.turns == record.usage["turns"]
        assert row.task == record.metadata["task_id"]
        assert row.agent == record.metadata["agent"]
        assert index.read_record(row)["rollout_id"] == record.rollout_id


def test_a_row_counts_the_changes_refused_before_grading_and_the_refused_connections(tmp_path):
    import dataclasses

    refused = {"kind": "tampering", "at": 1001.0, "total": 3, "counts": {"test": 2, "shadowing": 1},
               "refused": [{"path": "conftest.py", "kind": "test", "change": "added"}]}
    egress = [{"kind": "limit_hit", "at": 1000.5, "limit": "egress", "count": 2},
              {"kind": "limit_hit", "at": 1000.5, "limit": "pids", "count": 7},
              {"kind": "egress_refused", "at": 1000.5, "host": "example.org", "port": 443, "reason": "not listed"}]
    record = make_record("t", reward=0.0)
    record = dataclasses.replace(record, events=[*record.events, *egress, refused])
    line = record.to_json()
    slow = summarise_line(0, 0, orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS))
    assert summarise_line(0, 0, line).tampered == slow.tampered == 3
    assert summarise_line(0, 0, line).egress_refused == slow.egress_refused == 2
    untouched = summarise_line(0, 0, make_record("u").to_json()).to_json_dict()
    assert untouched["tampered"] == untouched["egress_refused"] == 0


def test_the_fast_summary_and_a_full_parse_give_the_same_row(tmp_path):
    record = make_record("z", reward=0.5, samples=[(False, None), (False, "tools changed"), (True, None)])
    line = record.to_json()
    fast = summarise_line(0, 0, line)
    spaced = orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS)  # another writer's field order
    slow = summarise_line(0, 0, spaced)
    assert fast is not None and slow is not None
    for name in ("rollout_id", "status", "reward", "task", "agent", "turns", "samples", "auxiliary", "forks",
                 "prompt_tokens", "completion_tokens", "started_at", "finished_at"):
        assert getattr(fast, name) == getattr(slow, name), name


def test_lines_appended_later_are_picked_up_and_a_half_written_line_waits(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    _write(path, [make_record("first")])
    index = RecordIndex.open(path)
    assert len(index.rows) == 1 and not index.refresh()
    line = make_record("second").to_json() + b"\n"
    with open(path, "ab") as f:
        f.write(line[:100])  # a writer caught mid-line
    assert not index.refresh() and len(index.rows) == 1
    with open(path, "ab") as f:
        f.write(line[100:])
    assert index.refresh()
    assert [row.rollout_id for row in index.rows] == ["first", "second"]
    assert index.read_record(index.rows[1])["rollout_id"] == "second"


def test_a_file_started_again_is_read_from_the_top(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    _write(path, [make_record("old-1"), make_record("old-2")])
    index = RecordIndex.open(path)
    path.unlink()
    _write(path, [make_record("new")])
    index.refresh()
    assert [row.rollout_id for row in index.rows] == ["new"]


def test_a_run_directory_gives_records_and_training_steps_and_skips_lines_that_are_not_records(tmp_path):
    _write(tmp_path / "rollouts.jsonl", [make_record("r1", reward=1.0), make_record("r2", reward=0.0)])
    with open(tmp_path / "rollouts.jsonl", "ab") as f:
        f.write(b'{"not": "a record"}\n')
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.25}\n{"step": 2, "reward": 0.5}\n')
    index = RecordIndex.open(tmp_path)
    assert len(index.rows) == 2 and index.skipped == 1
    summary = run_summary(index)
    assert summary["curves"]["reward"] == [[1, 0.25], [2, 0.5]]
    assert summary["mean_reward"] == 0.5 and summary["by_status"] == {"ok": 2}
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward": 0.75}\n')
    index.refresh()
    assert run_summary(index)["curves"]["reward"][-1] == [3, 0.75]


def test_the_table_filters_sorts_and_pages(tmp_path):
    records = [make_record(f"r{i}", task=f"t{i % 3}", reward=i / 10, started_at=1000.0 + i) for i in range(10)]
    records.append(make_record("bad", status="failed", failure=Failure(cause="sandbox", message="x"), reward=None))
    _write(tmp_path / "rollouts.jsonl", records)
    index = RecordIndex.open(tmp_path)
    result = page(index, RolloutQuery.from_params({"task": "t1", "sort": "reward", "order": "asc"}))
    assert [row["rollout_id"] for row in result["rows"]] == ["r1", "r4", "r7"]
    assert page(index, RolloutQuery.from_params({"cause": "sandbox"}))["total"] == 1
    assert page(index, RolloutQuery.from_params({"min_reward": "0.5"}))["total"] == 5
    second = page(index, RolloutQuery.from_params({"limit": "4", "offset": "4", "sort": "started_at"}))
    assert second["total"] == 11 and [row["rollout_id"] for row in second["rows"]] == ["r5", "r4", "r3", "r2"]
    assert set(result["facets"]["task"]) == {"t0", "t1", "t2", "task-a"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sort": "nonsense"}, "sort must be one of"),
        ({"limit": "0"}, "limit must be between 1 and 1000"),
        ({"min_reward": "high"}, "min_reward must be a number"),
        ({"min_reward": "nan"}, "min_reward must be finite"),
        ({"colour": "red"}, "unknown query parameter(s) colour"),
    ],
)
def test_a_bad_query_is_refused_naming_the_parameter(params, message):
    from interceptor.errors import BadRequest

    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        RolloutQuery.from_params(params)


def test_rows_sort_by_reward_with_ungraded_rollouts_together(tmp_path):
    records = [make_record("x", reward=0.5), make_record("y", reward=None, status="failed",
                                                       failure=Failure(cause="agent", message="m")),
               make_record("z", reward=1.0)]
    _write(tmp_path / "r.jsonl", records)
    index = RecordIndex.open(tmp_path / "r.jsonl")
    rows = page(index, RolloutQuery.from_params({"sort": "reward", "order": "asc"}))["rows"]
    assert [row["rollout_id"] for row in rows] == ["y", "x", "z"]


def test_the_recorders_field_order_is_the_one_the_fast_summary_reads():
    # a change of order would not make rows wrong (they fall back to a full parse) but would slow the viewer
    fields = [f for f in RolloutRecord.__dataclass_fields__]
    assert fields[:5] == ["rollout_id", "mode", "status", "samples", "trace"] and fields[5] == "usage"
    assert "auxiliary" in SampleRecord.__dataclass_fields__ and "completion_start" in TurnRecord.__dataclass_fields__
