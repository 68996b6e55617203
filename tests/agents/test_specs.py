"""Agent specs: the files, environment and argv each one produces for a rollout, and where the secret may go.

No agent is run here (tests/e2e/test_agents_*.py run the real ones): a fake executable stands in for the program.
"""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agents import (
    AGENTS,
    AgentConfigError,
    AgentLaunch,
    AgentNotInstalled,
    AgentRollout,
    AgentSpec,
    CommandAgent,
    OpenCodeAgent,
    PiAgent,
)
from agents.specs.mini_swe import MiniSweAgent
from agents.specs.packages import MINI_SWE, OPENCODE, PI, STAMP, AgentPackage, find_binary
from agents.specs.spec import BoxFile, write_box_files

SECRET = "s3cr3t-Token_abc.DEF~42"
# An instruction that argv parsing would mangle: a leading dash, an @file, quotes, newlines, a placeholder.
TRICKY = '-rf @notes.md say "hi"\n  then {model}\n'


@pytest.fixture
def fake_program(tmp_path) -> Path:
    program = tmp_path / "bin" / "fake-agent"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    return program


def prepared(spec: AgentSpec, rollout: AgentRollout) -> AgentLaunch:
    """The spec's launch, with its files written as a sandbox sharing this host's file system writes them."""
    launch = spec.prepare(rollout)
    write_box_files(launch.files, rollout.home.parent)
    return launch


def fake_install(package: AgentPackage, fake_program: Path) -> Path:
    """The program of a fake install of `package`, laid out as its registry's installs are: the fake program itself
    for npm; for PyPI a venv's `bin/python` beside the package's files the spec reads (mini's own config)."""
    if package.registry == "npm":
        return fake_program
    venv = fake_program.parent.parent / "venv"
    config = venv / "lib" / "python3.11" / "site-packages" / "minisweagent" / "config" / "mini.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("agent: {}\n")
    python = venv / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(fake_program)
    return python


@pytest.fixture
def rollout(tmp_path) -> AgentRollout:
    (tmp_path / "workspace").mkdir()
    (tmp_path / "home").mkdir()
    return AgentRollout(
        base_url="http://127.0.0.1:8123/rollout/r1/v1",
        secret=SECRET,
        model="policy",
        workspace=tmp_path / "workspace",
        home=tmp_path / "home",
        instruction=TRICKY,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def files_holding(root: Path, text: str) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and text in p.read_text(errors="replace")}


def assert_secret_only_in_private_files(launch: AgentLaunch, rollout: AgentRollout, expected: set[Path]) -> None:
    assert files_holding(rollout.home, SECRET) == expected
    assert all(mode(path) == 0o600 for path in expected)
    assert all(SECRET not in arg for arg in launch.argv)
    assert all(SECRET not in value for value in launch.env.values()), "the agent's tools would inherit it"
    assert "OPENAI_API_KEY" not in launch.env
    assert launch.secrets == (SECRET,)  # so the sandbox scrubs it from the output it keeps


def test_pi_writes_models_and_settings_and_keeps_the_secret_in_a_0600_file(rollout, fake_program):
    launch = prepared(PiAgent(binary=fake_program, context_window=8192, max_tokens=1024), rollout)
    agent_dir = rollout.home / ".pi" / "agent"
    models = json.loads((agent_dir / "models.json").read_text())
    assert models == {
        "providers": {
            "interceptor": {
                "baseUrl": rollout.base_url,
                "api": "openai-completions",
                "apiKey": SECRET,
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [{"id": "policy", "contextWindow": 8192, "maxTokens": 1024, "reasoning": False}],
            }
        }
    }
    settings = json.loads((agent_dir / "settings.json").read_text())
    assert settings["compaction"] == {"enabled": False}
    assert set(launch.files_written) == {agent_dir / "models.json", agent_dir / "settings.json"}
    assert_secret_only_in_private_files(launch, rollout, {agent_dir / "models.json"})
    assert launch.env == {"HOME": str(rollout.home), "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"}
    assert launch.argv == (str(fake_program), "--provider", "interceptor", "--model", "policy", "--no-session", "-p")
    assert launch.cwd == rollout.workspace


def test_pi_and_opencode_get_the_instruction_verbatim_on_stdin_not_in_argv(rollout, fake_program):
    for spec in (PiAgent(binary=fake_program), OpenCodeAgent(binary=fake_program)):
        launch = prepared(spec, rollout)
        assert launch.stdin == TRICKY.encode()
        assert not any("notes.md" in arg for arg in launch.argv)


def test_pi_extra_args_go_before_the_print_flag(rollout, fake_program):
    launch = prepared(PiAgent(binary=fake_program, extra_args=("--no-context-files",)), rollout)
    assert launch.argv[-2:] == ("--no-context-files", "-p")  # after -p, Pi would take it as the message


def test_pi_settings_overrides_merge_over_the_defaults(rollout, fake_program):
    prepared(PiAgent(binary=fake_program, settings={"retry": {"enabled": False}}), rollout)
    settings = json.loads((rollout.home / ".pi" / "agent" / "settings.json").read_text())
    assert settings["retry"] == {"enabled": False} and settings["compaction"] == {"enabled": False}


def test_opencode_config_names_the_policy_for_both_models_and_keeps_the_secret_in_a_0600_file(rollout, fake_program):
    launch = prepared(OpenCodeAgent(binary=fake_program, context_window=8192, max_tokens=512), rollout)
    config_path = Path(launch.env["OPENCODE_CONFIG"])
    assert config_path.is_relative_to(rollout.home)
    config = json.loads(config_path.read_text())
    assert config["model"] == config["small_model"] == "interceptor/policy"
    assert config["provider"]["interceptor"] == {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Interceptor",
        "options": {"baseURL": rollout.base_url, "apiKey": SECRET},
        "models": {"policy": {"name": "policy", "limit": {"context": 8192, "input": 8192, "output": 512}}},
    }
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert config["compaction"] == {"auto": True, "prune": False, "reserved": 2048}  # a summary forks a sample
    assert_secret_only_in_private_files(launch, rollout, {config_path})
    assert launch.argv == (str(fake_program), "run", "-m", "interceptor/policy")


def test_opencode_gets_its_own_home_xdg_dirs_and_no_network_extras(rollout, fake_program):
    env = prepared(OpenCodeAgent(binary=fake_program), rollout).env
    assert env["HOME"] == str(rollout.home)
    for key in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        assert Path(env[key]).is_relative_to(rollout.home)
    for flag in ("AUTOUPDATE", "MODELS_FETCH", "LSP_DOWNLOAD", "SHARE"):
        assert env[f"OPENCODE_DISABLE_{flag}"] == "1"


def test_opencode_plugin_install_is_marked_done_unless_asked_for(rollout, fake_program):
    config_dir = rollout.home / ".config" / "opencode"
    prepared(OpenCodeAgent(binary=fake_program), rollout)
    lock = json.loads((config_dir / "package-lock.json").read_text())
    assert "@opencode-ai/plugin" in lock["packages"][""]["dependencies"]
    assert (config_dir / "node_modules").is_dir()

    other = rollout.home.parent / "home2"
    other.mkdir()
    prepared(OpenCodeAgent(binary=fake_program, skip_plugin_install=False), replace(rollout, home=other))
    assert not (other / ".config" / "opencode").exists()


def test_opencode_config_overrides_replace_top_level_keys(rollout, fake_program):
    launch = prepared(OpenCodeAgent(binary=fake_program, config={"permission": {"webfetch": "deny"}}), rollout)
    config = json.loads(Path(launch.env["OPENCODE_CONFIG"]).read_text())
    assert config["permission"] == {"webfetch": "deny"} and "provider" in config


def test_command_agent_gets_the_openai_variables_and_placeholders_are_replaced_once(rollout, fake_program):
    spec = CommandAgent(argv=(str(fake_program), "--task", "{instruction}", "--in", "{workspace}"), env={"X": "1"})
    launch = prepared(spec, rollout)
    assert launch.argv == (str(fake_program), "--task", TRICKY, "--in", str(rollout.workspace))  # "{model}" kept
    assert launch.env == {
        "X": "1",
        "HOME": str(rollout.home),
        "OPENAI_BASE_URL": rollout.base_url,
        "OPENAI_API_KEY": SECRET,
        "OPENAI_MODEL": "policy",
    }
    assert launch.stdin == TRICKY.encode() and launch.secrets == (SECRET,)
    assert prepared(CommandAgent(argv=(str(fake_program),), instruction_on_stdin=False), rollout).stdin is None


def test_command_agent_may_not_override_the_rollout_variables():
    with pytest.raises(AgentConfigError, match="OPENAI_API_KEY"):
        CommandAgent(argv=("x",), env={"OPENAI_API_KEY": "mine"})


def test_command_agent_with_a_missing_program_says_so(rollout):
    with pytest.raises(AgentNotInstalled, match="no-such-agent"):
        prepared(CommandAgent(argv=("no-such-agent",)), rollout)


def test_missing_agent_raises_with_how_to_install(rollout, tmp_path, monkeypatch):
    monkeypatch.setenv("INTERCEPTOR_AGENTS_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(AgentNotInstalled) as pi:
        prepared(PiAgent(), rollout)
    assert "interceptor agents install pi" in str(pi.value) and "@mariozechner/pi-coding-agent@0.73.1" in str(pi.value)
    with pytest.raises(AgentNotInstalled, match="interceptor agents install opencode"):
        prepared(OpenCodeAgent(), rollout)


def test_the_pinned_install_is_used_only_once_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    binary = OPENCODE.prefix(tmp_path) / "node_modules" / ".bin" / "opencode"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    with pytest.raises(AgentNotInstalled):  # no stamp: an interrupted install
        find_binary(OPENCODE, root=tmp_path)
    (OPENCODE.prefix(tmp_path) / STAMP).write_text(OPENCODE.version + "\n")
    assert find_binary(OPENCODE, root=tmp_path) == binary


def test_an_agent_on_path_is_found_when_not_installed(tmp_path, monkeypatch, fake_program):
    (fake_program.parent / "pi").symlink_to(fake_program)
    monkeypatch.setenv("PATH", str(fake_program.parent))
    assert find_binary(PI, root=tmp_path / "empty") == fake_program.parent / "pi"


def test_an_explicit_binary_must_be_executable(tmp_path, rollout):
    not_executable = tmp_path / "pi"
    not_executable.write_text("")
    with pytest.raises(AgentConfigError, match="not an executable"):
        prepared(PiAgent(binary=not_executable), rollout)


@pytest.mark.parametrize("secret", ["!cat /etc/passwd", "{env:HOME}", "has space", ""])
def test_a_secret_an_agent_would_interpret_is_refused(tmp_path, secret):
    with pytest.raises(AgentConfigError, match="bearer token"):
        AgentRollout(
            base_url="http://h/v1", secret=secret, model="m", workspace=tmp_path, home=tmp_path, instruction="x"
        )


def test_a_secret_in_argv_is_refused(tmp_path):
    with pytest.raises(AgentConfigError, match="argv"):
        AgentLaunch(argv=("agent", f"--key={SECRET}"), env={}, cwd=tmp_path, secrets=(SECRET,))


def test_reprs_never_show_the_secret(rollout, fake_program):
    launch = prepared(CommandAgent(argv=(str(fake_program),)), rollout)
    assert SECRET not in repr(rollout) and SECRET not in repr(launch)
    assert "OPENAI_API_KEY" in repr(launch)  # keys are shown, values are not


@pytest.mark.parametrize("name", [name for name, kind in AGENTS.items() if kind.package is not None])
def test_every_registered_agent_launches_its_binary_with_the_endpoint_and_no_secret_in_argv(name, fake_program,
                                                                                          rollout):
    """Each agent `interceptor run --agent NAME` can build: a spec of the protocol, named as registered, whose launch
    runs the binary it was given in the rollout's workspace, reaches the rollout's endpoint (in its environment or a
    file it wrote), keeps the secret out of argv and declares it for scrubbing."""
    binary = fake_install(AGENTS[name].package, fake_program)
    spec = AGENTS[name].spec(binary=binary)
    assert isinstance(spec, AgentSpec) and spec.name == name
    launch = prepared(spec, rollout)
    assert launch.argv[0] == str(binary) and launch.cwd == rollout.workspace
    assert not any(SECRET in arg for arg in launch.argv) and SECRET in launch.secrets
    told = "\n".join(launch.env.values()) + "".join(p.read_text(errors="replace") for p in launch.files_written
                                                     if p.is_file())
    assert rollout.base_url.removesuffix("/v1") in told
    assert fake_program.resolve() in launch.host_paths


def test_mini_swe_agent_gets_the_task_and_the_secret_in_its_0600_config_not_in_argv_or_env(rollout, fake_program):
    python = fake_install(MINI_SWE, fake_program)
    spec = MiniSweAgent(binary=python, max_tokens=64, step_limit=9, config={"agent": {"mode": "confirm"}})
    launch = prepared(spec, rollout)
    config_file = rollout.home / ".config" / "mini-swe-agent" / "interceptor.yaml"
    assert_secret_only_in_private_files(launch, rollout, {config_file})
    config = json.loads(config_file.read_text())  # JSON, which mini's YAML loader reads
    assert config["run"]["task"] == TRICKY and not any(TRICKY.strip() in arg for arg in launch.argv)
    assert config["model"]["model_kwargs"] == {"api_base": rollout.base_url, "api_key": SECRET,
                                               "custom_llm_provider": "openai", "drop_params": True, "max_tokens": 64}
    assert config["model"]["model_name"] == "policy" and config["model"]["cost_tracking"] == "ignore_errors"
    assert config["agent"] == {"mode": "confirm", "confirm_exit": False, "cost_limit": 0, "step_limit": 9}
    # The interpreter runs the module isolated, over mini's own config named by its absolute path (a mini.yaml in
    # the workspace would be read first otherwise), and writes no trajectory (it would repeat the secret).
    mini_yaml = python.parent.parent / "lib" / "python3.11" / "site-packages" / "minisweagent" / "config" / "mini.yaml"
    assert launch.argv == (str(python), "-I", "-m", "minisweagent", "--config", str(mini_yaml), "--config",
                           str(config_file), "--output", "/dev/null")
    assert launch.env["MSWEA_CONFIGURED"] == "true" and launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert launch.env["HOME"] == str(rollout.home)


def test_mini_swe_agent_from_a_program_that_is_no_install_of_it_is_refused(rollout, fake_program):
    with pytest.raises(AgentConfigError, match="not a mini-swe-agent install"):
        prepared(MiniSweAgent(binary=fake_program), rollout)
    with pytest.raises(AgentConfigError):
        MiniSweAgent(command_timeout_s=0)


def test_a_pypi_package_runs_its_module_from_the_venv_and_an_npm_one_its_program():
    assert MINI_SWE.spec == "mini-swe-agent==2.4.6" and PI.spec == "@mariozechner/pi-coding-agent@0.73.1"
    assert MINI_SWE.program(Path("/p")) == Path("/p/venv/bin/python")
    assert MINI_SWE.command(Path("/p/venv/bin/python")) == ("/p/venv/bin/python", "-I", "-m", "minisweagent")
    assert MINI_SWE.command(Path("/home/u/.local/bin/mini")) == ("/home/u/.local/bin/mini",)
    assert PI.command(Path("/x/pi")) == ("/x/pi",)
    with pytest.raises(AgentConfigError, match="names the module"):
        AgentPackage(name="x", package="x", version="1", bin="x", registry="pypi")


@pytest.mark.parametrize("name", [name for name, kind in AGENTS.items() if kind.package is not None])
def test_a_spec_writes_nothing_itself_the_sandbox_writes_its_files(name, fake_program, rollout):
    """`prepare` only describes the files (a box that shares no file system with this host gets them through its
    own channel); what they hold, with their modes, is what the agent reads once written."""
    launch = AGENTS[name].spec(binary=fake_install(AGENTS[name].package, fake_program)).prepare(rollout)
    assert list(rollout.home.iterdir()) == [] and launch.files
    assert all(f.path.is_relative_to(rollout.home) for f in launch.files)
    write_box_files(launch.files, rollout.home.parent)
    for box_file in launch.files:
        assert mode(box_file.path) == box_file.mode
        if box_file.data is not None:
            assert box_file.path.read_bytes() == box_file.data


def test_box_files_are_written_only_inside_the_rollouts_directory(tmp_path):
    root = tmp_path / "rollout"
    (root / "home").mkdir(parents=True)
    with pytest.raises(AgentConfigError, match="outside"):
        write_box_files((BoxFile(tmp_path / "elsewhere" / "x", b"1"),), root)
    (root / "home" / "link").symlink_to(tmp_path, target_is_directory=True)  # a link the agent could have made
    with pytest.raises(AgentConfigError, match="outside"):
        write_box_files((BoxFile(root / "home" / "link" / "x", b"1"),), root)
    assert not (tmp_path / "x").exists()
    (root / "home" / "file-link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):  # O_NOFOLLOW: a link in the file's place is not written through
        write_box_files((BoxFile(root / "home" / "file-link", b"1"),), root)
    assert not (tmp_path / "target").exists()
    with pytest.raises(AgentConfigError, match="absolute"):
        BoxFile(Path("relative"), b"")


def test_the_command_agent_satisfies_the_protocol():
    assert isinstance(CommandAgent(argv=("x",)), AgentSpec)


def test_the_registry_builds_each_agent_from_the_shared_settings_and_names_what_install_and_train_take():
    from agents.specs.packages import PACKAGES
    from agents.specs.registry import AgentSettings, build_agent, installable, trainable

    settings = AgentSettings(context_window=4096, max_tokens=256, command="python agent.py")
    for name, kind in AGENTS.items():
        spec = build_agent(name, settings)
        assert type(spec) is kind.spec and spec.name == name
    assert build_agent("pi", settings).max_tokens == 256 and build_agent("pi", AgentSettings(
        context_window=4096)).max_tokens == 512
    assert sorted(installable()) == sorted(PACKAGES)  # `agents install` and the registry agree
    assert set(trainable()) == {"pi", "opencode", "command"}
    with pytest.raises(AgentConfigError, match="unknown agent 'gemini'"):
        build_agent("gemini", settings)
    with pytest.raises(AgentConfigError, match="needs a command line"):
        build_agent("command", AgentSettings(context_window=4096))


def test_invalid_spec_settings_are_refused():
    with pytest.raises(AgentConfigError):
        PiAgent(context_window=1024, max_tokens=2048)
    with pytest.raises(AgentConfigError):
        OpenCodeAgent(provider="a/b")


def test_a_command_agents_instruction_naming_a_host_file_does_not_get_it_bound_into_the_box(tmp_path, rollout):
    """The script the spec's argv names is what the box runs from; a task file the instruction names is not."""
    script = tmp_path / "agent.py"
    script.write_text("")
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text('{"grader": {"expected": "7"}}\n')
    launch = prepared(CommandAgent(argv=(sys.executable, str(script), "{instruction}")),
                      replace(rollout, instruction=str(task_file)))
    assert launch.argv[-1] == str(task_file)  # the agent is told the path ...
    assert script.resolve() in launch.host_paths and task_file.resolve() not in launch.host_paths  # ... not given it
