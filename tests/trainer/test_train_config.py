"""`interceptor train --config FILE --set KEY=VALUE`: the file's keys, overridden from the command line, each checked
before anything starts; a bad key or value is a message and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.train_main import TrainConfig


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('tasks = "examples/tasks/arithmetic.jsonl"\nmax_steps = 20\nagent = "pi"\n')
    return path


def test_overrides_replace_the_files_keys_and_read_values_as_toml(config_file):
    config = TrainConfig.load(config_file, ["max_steps=2", "view=true", "host='0.0.0.0'", "agent=command",
                                            "learning_rate=3e-6", "out = runs/x"])
    assert (config.max_steps, config.view, config.host, config.agent) == (2, True, "0.0.0.0", "command")
    assert config.learning_rate == 3e-6 and config.out == Path("runs/x")  # a bare word is a string
    weighted = TrainConfig.load(config_file, ["chain_weights={summary = 1.0, auxiliary = 0.5}"])
    assert weighted.chain_weights == {"summary": 1.0, "auxiliary": 0.5}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["max_steps=two"], "max_steps must be int, not 'two'"),
        (["view=1"], "view must be bool, not 1"),
        (["port=true"], "port must be int, not True"),
        (["colour=red"], "unknown keys ['colour']"),
        (["max_steps"], "--set wants KEY=VALUE, not 'max_steps'"),
        (["chain_weights={subagents = 1.0}"], "chain_weights: unknown kinds ['subagents']"),
        (["chain_weights={summary = -1}"], "chain_weights.summary must be a finite number >= 0"),
        (["chain_weights=1"], "chain_weights must be a table of kind = weight, not 1"),
    ],
)
def test_a_bad_override_is_refused_naming_it(config_file, overrides, message):
    with pytest.raises(ValueError) as raised:
        TrainConfig.load(config_file, overrides)
    assert message in str(raised.value)


def test_the_command_says_what_is_wrong_and_exits_2(config_file):
    done = subprocess.run([sys.executable, "-m", "interceptor.cli", "train", "--config", str(config_file),
                           "--set", "max_steps=-1x"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "max_steps must be int" in done.stderr and "Traceback" not in done.stderr
