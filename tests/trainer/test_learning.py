"""Measuring learning: task families whose training and held-out splits share no instance, and `interceptor
evaluate`, a checkpoint's held-out success rate with its Wilson interval, measured through a real agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.tasks import load_tasks
from trainer.learning.evaluate import wilson
from trainer.learning.families import FAMILIES, write_family

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "simple_agent.py"


def test_wilson_intervals_match_the_textbook_values():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(57, 200) == pytest.approx((0.2270, 0.3512), abs=1e-4)
    with pytest.raises(ValueError):
        wilson(3, 2)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_splits_share_no_instance_and_are_the_same_for_a_seed(name, tmp_path):
    first = write_family(name, tmp_path / "a", seed=7, train=60, held_out=30)
    write_family(name, tmp_path / "b", seed=7, train=60, held_out=30)
    write_family(name, tmp_path / "c", seed=8, train=60, held_out=30)

    train, held_out = load_tasks(tmp_path / "a" / "train.jsonl"), load_tasks(tmp_path / "a" / "held_out.jsonl")
    assert (len(train), len(held_out)) == (60, 30) and first["family"] == name
    instance = {t.id: (t.instruction, tuple(sorted(t.files.items())), t.grader.expected) for t in train + held_out}
    assert not {instance[t.id] for t in train} & {instance[t.id] for t in held_out}
    shots = json.loads((tmp_path / "a" / "shots.json").read_text())
    shown = [m["content"] for m in shots if m["role"] == "user"]
    assert len(shown) == 3 and not set(shown) & {t.instruction for t in train + held_out if name != "lookup"}
    for split in ("train.jsonl", "held_out.jsonl", "shots.json"):
        assert (tmp_path / "a" / split).read_bytes() == (tmp_path / "b" / split).read_bytes()
    assert (tmp_path / "a" / "held_out.jsonl").read_bytes() != (tmp_path / "c" / "held_out.jsonl").read_bytes()
    assert all(t.grader.kind == "answer" for t in train + held_out)


def test_a_family_asked_for_more_than_it_holds_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at most"):
        write_family("add", tmp_path, seed=0, train=4000, held_out=100)
    with pytest.raises(ValueError, match="unknown family"):
        write_family("chess", tmp_path, seed=0, train=1, held_out=1)


def _evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "interceptor.cli", "evaluate", *args],
                          capture_output=True, text=True, timeout=900, check=False)


def test_evaluate_measures_a_real_model_through_the_agent_and_keeps_one_entry_per_label(smollm2_dir, tmp_path):
    """The real SmolLM2 through the few-shot OpenAI-SDK agent on two held-out `submit` tasks, twice each: every
    rollout graded on the host, the rate and interval computed from the records, the entry kept under its label."""
    write_family("submit", tmp_path / "tasks", seed=3, train=4, held_out=2)
    config = tmp_path / "train.toml"
    config.write_text(
        f'model = "{smollm2_dir}"\nupstream = "local"\nagent = "command"\n'
        f'command = "{sys.executable} {AGENT} --shots {tmp_path / "tasks" / "shots.json"} --max-turns 2"\n'
        f'tasks = "{tmp_path / "tasks" / "train.jsonl"}"\nmax_tokens = 40\nconcurrency = 4\n'
    )
    out = tmp_path / "eval"
    args = ("--config", str(config), "--tasks", str(tmp_path / "tasks" / "held_out.jsonl"), "--model",
            str(smollm2_dir), "-k", "2", "--out", str(out))
    done = _evaluate(*args, "--label", "before")
    assert done.returncode == 0, done.stderr[-3000:]

    [entry] = json.loads((out / "eval.json").read_text())
    records = [json.loads(line) for line in (out / "before" / "rollouts.jsonl").read_text().splitlines()]
    graded = [r for r in records if r["status"] == "ok" and r["reward"] is not None]
    assert entry["label"] == "before" and entry["rollouts"] == len(records) == 4
    assert entry["graded"] == len(graded) and entry["graded"] + sum(entry["failed"].values()) == 4
    assert entry["successes"] == sum(r["reward"] >= 1 for r in graded)
    assert entry["ci95"] == list(wilson(entry["successes"], entry["graded"]))
    assert all(r["samples"] for r in graded)  # each one went through the gate, token by token
    assert f"before: {entry['successes']}/{entry['graded']}" in done.stdout

    crashing = ("--set", f'command="{sys.executable} -c \'import sys; sys.exit(3)\'"')
    assert _evaluate(*args, "--label", "crashing", *crashing).returncode == 0
    assert _evaluate(*args, "--label", "crashing", *crashing, "-k", "1").returncode == 0
    entries = json.loads((out / "eval.json").read_text())
    assert [e["label"] for e in entries] == ["before", "crashing"]  # a label measured again is replaced
    crashed = entries[1]
    assert (crashed["rollouts"], crashed["graded"], crashed["rate"], crashed["failed"]) == (2, 0, None, {"agent": 2})


def test_evaluate_refuses_what_it_cannot_measure(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('tasks = "t.jsonl"\n')
    done = _evaluate("--config", str(config), "--tasks", "t.jsonl", "--model", str(tmp_path / "none"), "--out",
                     str(tmp_path / "out"))
    assert done.returncode == 2 and "is not a model directory" in done.stderr
    done = _evaluate("--config", str(config), "--tasks", "t.jsonl", "--model", str(tmp_path), "-k", "0",
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "-k must be at least 1" in done.stderr


def test_the_recipe_report_joins_the_steps_and_the_held_out_rates(tmp_path):
    """`examples/train_smollm2_cpu/report.py` on a run's files: one row per step (the last log of a step wins), a
    step's seconds as the sum of its parts, and each held-out entry with its interval."""
    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    rows = [{"step": 1, "loss": 0.1}, {"step": 1, "rollouts/reward_mean": 0.25, "logprob_gap/max": 3e-5,
                                       "perf/rollout_wait_s": 10.0, "perf/fwd_bwd_s": 5.0, "perf/optimizer_s": 1.0,
                                       "perf/weight_sync_s": 0.5},
            {"step": 2, "rollouts/reward_mean": 0.75, "perf/fwd_bwd_s": 4.0}]
    (tmp_path / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"label": "before", "successes": 57, "graded": 200, "rate": 0.285, "ci95": list(wilson(57, 200)),
             "failed": {}, "model": "m"}
    (tmp_path / "eval" / "eval.json").write_text(json.dumps([entry]))
    from interceptor.tools.rescore import GapStats, RescoreReport, RolloutGap

    gaps = GapStats.of([0.0, 1e-6, 3e-5])
    rescored = RescoreReport(upstream="http://127.0.0.1:8000", model="m", overall=gaps, skipped=(), worst=(),
                             rollouts=(RolloutGap(rollout_id="r1", samples=2, stats=gaps),))
    (tmp_path / "rescore.json").write_bytes(rescored.to_json())
    script = Path(__file__).resolve().parents[2] / "examples" / "train_smollm2_cpu" / "report.py"

    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(s["step"], s["reward"], s["step_s"]) for s in report["steps"]] == [(1, 0.25, 16.5), (2, 0.75, 4.0)]
    assert report["steps"][0]["gap_max"] == 3e-5 and report["held_out"][0]["ci95"] == entry["ci95"]
    assert "held-out before: 57/200 = 0.285" in done.stdout and (tmp_path / "report.png").is_file()
    assert report["rescore"]["tokens"] == 3 and report["rescore"]["max"] == 3e-5 and report["rescore"]["samples"] == 2
    assert "3 sampled tokens of 2 samples, max gap 3e-05" in done.stdout


def test_a_family_writes_a_worked_solution_for_each_training_task_and_none_for_a_held_out_one(tmp_path):
    write_family("add", tmp_path, seed=5, train=20, held_out=10)
    train = {t.id: t for t in load_tasks(tmp_path / "train.jsonl")}
    held_out = load_tasks(tmp_path / "held_out.jsonl")
    gold = [json.loads(line) for line in (tmp_path / "train_gold.jsonl").read_text().splitlines()]
    assert [g["task_id"] for g in gold] == list(train)
    for row in gold:
        task, messages = train[row["task_id"]], row["messages"]
        assert messages[0] == {"role": "user", "content": task.instruction}
        last_call = [m for m in messages if m.get("tool_calls")][-1]["tool_calls"][0]["function"]["arguments"]
        assert json.loads(last_call) == {"command": f"answer {task.grader.expected}"}
    told = {m["content"] for row in gold for m in row["messages"] if m["role"] == "user"}
    assert not told & {t.instruction for t in held_out}


def _prefix(tmp_path: Path, shots: Path) -> Path:
    done = subprocess.run([sys.executable, str(AGENT), "--shots", str(shots), "--print-prefix"], capture_output=True,
                          text=True, timeout=60, check=True)
    (tmp_path / "prefix.json").write_text(done.stdout)
    return tmp_path / "prefix.json"


def test_warm_start_rows_are_the_gates_prompt_then_the_agents_turn(smollm2_dir, tmp_path):
    """Each row's prompt is the ids the gate would send the policy for that request (prefix, task, solution so far);
    its completion, the only tokens with loss, is the assistant turn as the template renders it."""
    from transformers import AutoTokenizer

    from interceptor.tokens.rendering import Renderer, RendererConfig
    from trainer.learning.warm_start import training_rows

    write_family("add", tmp_path / "tasks", seed=2, train=2, held_out=1)
    prefix = json.loads(_prefix(tmp_path, tmp_path / "tasks" / "shots.json").read_text())
    solution = json.loads((tmp_path / "tasks" / "train_gold.jsonl").read_text().splitlines()[0])["messages"]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    rows = training_rows(tokenizer, [solution], prefix["messages"], prefix["tools"])
    turns = [i for i, m in enumerate(solution) if m["role"] == "assistant"]
    assert len(rows) == len(turns) == 3
    renderer = Renderer(RendererConfig(model_dir=smollm2_dir))
    for row, index in zip(rows, turns):
        prompt = row["input_ids"][:row["completion_mask"].index(1)]
        assert prompt == renderer.render_full([*prefix["messages"], *solution[:index]], prefix["tools"])
        assert set(row["completion_mask"][len(prompt):]) == {1}
    taught = tokenizer.decode([t for t, m in zip(rows[1]["input_ids"], rows[1]["completion_mask"]) if m])
    assert "<tool_call>" in taught and f"answer {solution[3]['content']}" in taught


def test_warm_start_fine_tunes_on_the_solutions_and_writes_a_checkpoint(smollm2_dir, tmp_path):
    write_family("add", tmp_path / "tasks", seed=2, train=2, held_out=1)
    prefix = _prefix(tmp_path, tmp_path / "tasks" / "shots.json")
    out = tmp_path / "warm"
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "warm-start", str(smollm2_dir), str(out), "--gold",
                           str(tmp_path / "tasks" / "train_gold.jsonl"), "--prefix", str(prefix), "--transcripts",
                           "1", "--batch-size", "3", "--learning-rate", "1e-4"],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "warm_start.json").read_text())
    assert (summary["transcripts"], summary["rows"], summary["optimizer_steps"]) == (1, 3, 1)
    from safetensors.torch import load_file

    before, after = load_file(smollm2_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after) and any(not (before[k] == after[k]).all() for k in before)
    assert (out / "tokenizer.json").is_file() and "warm-started" in done.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == []  # a checkpoint, not TRL's working files

    refused = subprocess.run([sys.executable, "-m", "interceptor.cli", "warm-start", str(smollm2_dir), str(out),
                              "--gold", str(tmp_path / "none.jsonl"), "--prefix", str(prefix)],
                             capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "none.jsonl is not a file" in refused.stderr
