"""Model directories are built all or nothing and say what they hold: a random tiny model is never taken for the
trained one, a build killed halfway never passes for a finished model, and someone else's directory is never
overwritten. Training runs a couple of steps on the small vocabulary except in the one command-line test."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from interceptor.cli import main
from trainer.models.local_model import LocalModelBuildFailed, ensure_local_model, make_local_model, prepare_local_model
from trainer.models.tiny_model import (
    MARKER,
    ModelDirError,
    TinyModelSpec,
    building,
    make_tiny_model,
    read_built_model,
    write_tiny_model,
)
from trainer.models.tool_model import ToolTrainingSpec, tool_model_spec

ROOT = Path(__file__).resolve().parents[2]
SMALL = tool_model_spec(real_vocab=False)  # the trained model's shape on the small test vocabulary
FEW_STEPS = ToolTrainingSpec(steps=2, warmup_steps=1, tokens_per_step=256, row_tokens=128)


def _weights(model_dir: Path) -> dict:
    return load_file(model_dir / "model.safetensors")


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def _episode_workers(parent: int) -> list[int]:
    """The live processes `parent` started as its build's episode worker (trainer.models.episode_process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(ppid) == parent and state != "Z" and b"trainer.models.episode_process" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _ended(pid: int, *, within_s: float = 30.0) -> bool:
    """Whether `pid` ends (or is a zombie) within the bound."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_tool_calling_over_a_random_model_trains_it_and_says_so(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["make-tiny-model", str(out), "--real-vocab"]) == 0
    assert read_built_model(out).kind == "random"
    capsys.readouterr()

    assert main(["make-tiny-model", str(out), "--tool-calling", "--train-steps", "1"]) == 0

    said = capsys.readouterr().out
    assert "replacing the random model" in said and "trained the tool loop for 1 steps" in said
    built = read_built_model(out)
    assert built.kind == "tool-calling" and built.training["report"]["steps"] == 1
    assert built.spec["max_position_embeddings"] == 32768 and built.spec["real_vocab"]
    assert _siblings(out) == []  # no build directory left beside it

    assert main(["make-tiny-model", str(out), "--tool-calling", "--train-steps", "1"]) == 0
    assert "already holds the tiny model trained to call tools (1 steps): kept" in capsys.readouterr().out


def test_a_random_model_given_to_serve_is_served_as_it_is_and_replaced_only_on_request(tmp_path):
    out = make_tiny_model(tmp_path / "model", SMALL)
    random_weights = _weights(out)

    assert ensure_local_model(out, spec=SMALL, training=FEW_STEPS) == out  # the CPU GRPO example trains it
    assert read_built_model(out).kind == "random"
    assert all(tensor.equal(random_weights[name]) for name, tensor in _weights(out).items())

    make_local_model(out, spec=SMALL, training=FEW_STEPS)  # what make-tiny-model --tool-calling does
    built = read_built_model(out)
    assert built.kind == "tool-calling" and built.training["spec"] == FEW_STEPS.to_json()
    trained = _weights(out)
    assert trained.keys() == random_weights.keys()
    assert any(not trained[name].equal(random_weights[name]) for name in trained)


def test_a_finished_trained_model_is_kept_whatever_training_the_caller_would_give(tmp_path, capsys):
    out = tmp_path / "model"
    make_local_model(out, spec=SMALL, training=FEW_STEPS)
    marker = (out / MARKER).read_text()
    weights = _weights(out)

    ensure_local_model(out, spec=SMALL, training=ToolTrainingSpec(steps=5))

    assert (out / MARKER).read_text() == marker
    assert all(tensor.equal(weights[name]) for name, tensor in _weights(out).items())


def test_a_build_killed_during_training_is_never_served_and_is_cleaned_up(tmp_path):
    out = tmp_path / "model"
    script = (
        "import sys\n"
        "from trainer.models.local_model import make_local_model\n"
        "from trainer.models.tool_model import ToolTrainingSpec, tool_model_spec\n"
        "make_local_model(sys.argv[1], spec=tool_model_spec(real_vocab=False),\n"
        "                 training=ToolTrainingSpec(steps=100_000, tokens_per_step=256, row_tokens=128))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        # The random weights are in the build directory: its episode worker is drawing the 100k steps' episodes.
        while not list(tmp_path.glob(f".model.building-{child.pid}-*/model.safetensors")):
            assert child.poll() is None, "the build exited before it wrote the random weights"
            if time.monotonic() > deadline:
                pytest.fail("the build did not write the random weights within its bound")
            time.sleep(0.05)
        time.sleep(0.5)
        [worker] = _episode_workers(child.pid)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    assert _ended(worker), "the episode worker outlived the build killed outright"
    assert not out.exists() and read_built_model(out) is None
    [abandoned] = _siblings(out)
    assert abandoned.startswith(f".model.building-{child.pid}-")

    ensure_local_model(out, spec=SMALL, training=FEW_STEPS)

    assert read_built_model(out).kind == "tool-calling"
    assert _siblings(out) == []  # the abandoned build directory is gone


def test_an_error_in_the_episode_worker_is_raised_by_the_build_which_leaves_nothing(tmp_path):
    request = tmp_path / "no_shell.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "tools": []}))
    out = tmp_path / "model"

    with pytest.raises(ValueError, match="no shell tool") as raised:
        make_local_model(out, spec=SMALL, training=dataclasses.replace(FEW_STEPS, agent_requests=(request,)))

    assert any("episode worker" in note for note in raised.value.__notes__)  # where it happened, with its traceback
    assert not out.exists() and _siblings(out) == ["no_shell.json"]
    assert _episode_workers(os.getpid()) == []


def test_a_build_that_fails_leaves_the_old_model_and_no_build_directory(tmp_path):
    out = make_tiny_model(tmp_path / "model", TinyModelSpec(seed=1))

    with pytest.raises(KeyboardInterrupt):
        with building(out) as work:
            write_tiny_model(work, TinyModelSpec(seed=2))
            raise KeyboardInterrupt  # interrupted before it finished (training, say)

    assert read_built_model(out).spec["seed"] == 1
    assert _siblings(out) == []


def test_a_marker_from_before_training_finished_is_not_taken_for_the_trained_model(tmp_path):
    # The layout an older version left when killed mid-training: the random model, trained weights or not, and a
    # marker without a kind.
    out = make_tiny_model(tmp_path / "model", SMALL)
    record = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({"spec": record["spec"], "vocab_size": record["vocab_size"]}))
    assert read_built_model(out).kind == "unknown"

    ensure_local_model(out, spec=SMALL, training=FEW_STEPS)

    assert read_built_model(out).kind == "tool-calling"


def test_a_directory_of_other_files_is_refused_and_left_untouched(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")

    assert main(["make-tiny-model", str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    with pytest.raises(ModelDirError):
        make_local_model(out, spec=SMALL, training=FEW_STEPS)
    with pytest.raises(ModelDirError):
        ensure_local_model(out, spec=SMALL, training=FEW_STEPS)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert _siblings(out) == []


def test_a_model_of_the_users_own_is_served_as_it_is_but_not_overwritten(tmp_path, capsys):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "config.json").write_text("{}")

    assert ensure_local_model(out, spec=SMALL, training=FEW_STEPS) == out
    assert main(["make-tiny-model", str(out), "--tool-calling"]) == 2
    assert "no model built by interceptor" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_make_tiny_model_replaces_a_model_it_built_and_an_empty_directory(tmp_path):
    out = make_tiny_model(tmp_path / "model", TinyModelSpec(seed=1))
    assert make_tiny_model(out, TinyModelSpec(seed=2)) == out
    assert read_built_model(out).spec["seed"] == 2

    empty = tmp_path / "empty"
    empty.mkdir()
    make_tiny_model(empty)
    assert read_built_model(empty).kind == "random"


@pytest.fixture
def no_child_process(monkeypatch):
    """Any child process started (a build) fails the test."""
    async def no_child(*args, **kwargs):
        raise AssertionError(f"a build was started: {args}")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_child)


async def test_the_policy_stack_serves_a_model_already_there_without_starting_a_build(tmp_path, no_child_process):
    random = make_tiny_model(tmp_path / "model", SMALL)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")

    assert await prepare_local_model(random) == random
    assert await prepare_local_model(theirs) == theirs


async def test_the_policy_stack_refuses_a_directory_of_other_files_before_any_build(tmp_path, no_child_process):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")

    with pytest.raises(ModelDirError):
        await prepare_local_model(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


async def test_a_build_in_the_child_that_fails_is_an_error_that_says_so(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "model"  # the child cannot make the build directory beside it

    with pytest.raises(LocalModelBuildFailed, match=r"building the local model in .* failed \(the build exited with 1"):
        await prepare_local_model(out)


async def test_a_cancelled_build_stops_its_child_and_leaves_no_build_directory(tmp_path):
    out = tmp_path / "model"
    build = asyncio.create_task(prepare_local_model(out))
    deadline = time.monotonic() + 120
    # The random weights are in the build directory: training has started, or is about to.
    while not list(tmp_path.glob(".model.building-*/model.safetensors")):
        assert not build.done(), build
        if time.monotonic() > deadline:
            build.cancel()
            pytest.fail("the child did not start its build within its bound")
        await asyncio.sleep(0.05)

    [building_dir] = tmp_path.glob(".model.building-*")
    child = int(building_dir.name.split("-")[1])
    [worker] = _episode_workers(child)

    build.cancel()
    with pytest.raises(asyncio.CancelledError):
        await build

    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the child is gone (and reaped)
    assert _ended(worker), "the child's episode worker outlived it"
    assert not out.exists()
    assert _siblings(out) == []  # no build directory left


def test_run_refuses_a_directory_of_other_files_as_its_local_model_with_a_clear_error(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")

    code = main(["run", "--agent", "pi", "--tasks", str(ROOT / "examples/tasks/arithmetic.jsonl"), "--upstream",
                 "local", "--model", str(out), "--out", str(tmp_path / "run")])

    assert code == 2
    assert "interceptor run: error:" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
