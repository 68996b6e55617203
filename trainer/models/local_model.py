"""The embedded default policy: the tiny model that `--upstream local` and the demo serve.

Built once into a directory and reused: the real Qwen vocabulary (agents' first requests run to thousands of
tokens: Pi's ~1.4k, Codex's ~6.1k, OpenCode's ~7.2k, Claude Code's ~11.6k), a 32k context, and under a minute of
supervised steps on two threads, then a check inside each agent's prompt (trainer.models.tool_model), so the model answers a
task by calling the agent's shell tool (`bash`, `Bash` or `exec_command`) with `answer N`, then finishes. While
the build imports torch and writes the random weights, a worker process makes the tokenizer and draws the episodes
(`trainer.models.episode_process`): the same build, its first step ~8 s sooner.

The build is all or nothing (`trainer.models.tiny_model.building`): the model is made and trained beside the target
directory, marked "tool-calling" with its spec and training, and only then renamed into place. So a build killed
mid-training never leaves a directory that passes for the trained model, and a random tiny model is never taken
for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path

from trainer.models.episode_process import EpisodeProcess
from trainer.models.tiny_model import (BuiltModel, ModelDirError, TinyModelSpec, building, check_replaceable, import_qwen3,
                         read_built_model, record_built_model, remove_abandoned_builds, write_random_weights)
from trainer.models.tool_model import ToolTrainingSpec, tool_model_spec, train_tool_calling

__all__ = ["LOCAL_MODEL_ERRORS", "LOCAL_MODEL_SPEC", "LOCAL_TRAINING", "LocalModelBuildFailed", "ensure_local_model",
           "local_model_error_exit", "make_local_model", "prepare_local_model"]

_CHILD_GRACE_S = 10.0  # a cancelled build's time to remove its directory before it is killed


class LocalModelBuildFailed(RuntimeError):
    """`prepare_local_model`'s child exited without building the model (its own output says why)."""


LOCAL_MODEL_ERRORS = (ModelDirError, LocalModelBuildFailed)


def local_model_error_exit(command: str, exc: Exception) -> int:
    """A command's one-line answer to one of `LOCAL_MODEL_ERRORS`, and its exit status: 2 for a directory it
    refused (the user's input), 1 for a build that failed."""
    print(f"interceptor {command}: error: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ModelDirError) else 1


LOCAL_MODEL_SPEC = dataclasses.replace(tool_model_spec(real_vocab=True), max_position_embeddings=32768)
# Pi's, OpenCode's, Claude Code's and Codex's real first requests (the messages around the task and the tools,
# secret removed): trained on, so the model answers inside those agents too.
AGENT_REQUESTS = tuple(sorted((Path(__file__).parent / "agent_requests").glob("*.json")))
# Claude Code twice per round: the hardest prompt (its ~2k-token environment, with "Shell: bash" in it, sits between
# the task and the answer; drawn as often as the others, its `Bash` came out as `bash` in 9 of 16 prompts).
LOCAL_TRAINING = ToolTrainingSpec(
    agent_requests=AGENT_REQUESTS,
    agent_weights=tuple(2 if path.name.startswith("claude") else 1 for path in AGENT_REQUESTS),
    check_responses=True,
    check_first_turns=8,
)


def ensure_local_model(
    model_dir: Path | str, *, spec: TinyModelSpec = LOCAL_MODEL_SPEC, training: ToolTrainingSpec = LOCAL_TRAINING
) -> Path:
    """The model directory `--upstream local` serves, given `--model DIR`:

    - a finished model built here, of any kind (a random tiny model is what the CPU GRPO example trains), or a
      model of the user's own (a `config.json` and no interceptor marker): served as it is;
    - absent or empty: the trained default is built there (all or nothing: a build killed half-way never lands);
    - anything else (a non-empty directory that is no model) raises `ModelDirError`, untouched.
    `make-tiny-model DIR --tool-calling` is the way to replace a random model with the trained one."""
    model_dir = Path(model_dir)
    if _servable(model_dir):
        return model_dir
    make_local_model(model_dir, spec=spec, training=training)
    return model_dir


async def prepare_local_model(model_dir: Path | str) -> Path:
    """`ensure_local_model` for an async caller (the policy stack): a model already there is served as it is, a
    directory that cannot be built into raises `ModelDirError` here, and a build runs in a child process
    (`python -m trainer.models.local_model DIR`, its output on this process's), awaited without blocking the loop.

    Why a child: the build sets process-wide state for its duration (torch's threads, deterministic kernels,
    glibc's malloc thresholds) and peaks near 3 GB, which the serving process then never holds; and it runs on the
    child's main thread. glibc gives each other thread an arena of its own, whose heaps go back to the system when
    free whatever `mallopt` says, so a build on a worker thread faulted its pages in at every step again (measured:
    7.0 million minor faults, 15.5 s of system time, 57 s, against 0.9-1.2 million, 4.3 s and ~50 s on a main
    thread). Cancelled, the child gets SIGTERM and then, if it lingers, SIGKILL; once it is gone, whatever build
    directory it left is removed here."""
    model_dir = Path(model_dir)
    if _servable(model_dir):
        return model_dir
    check_replaceable(model_dir)
    # This very package, wherever the caller imported it from (a Ray worker's working directory, say).
    path = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))))
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "trainer.models.local_model", str(model_dir),
                                                 env={**os.environ, "PYTHONPATH": path})
    try:
        code = await child.wait()
    except BaseException:
        await _end(child)
        raise
    finally:
        remove_abandoned_builds(model_dir)  # whatever a child that is gone left (none after a finished build)
    if code != 0:
        raise LocalModelBuildFailed(f"building the local model in {model_dir} failed (the build exited with {code}; "
                                    "its output is above)")
    return model_dir


async def _end(child: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if the child is still there after `_CHILD_GRACE_S`; return once it is reaped."""
    if child.returncode is not None:
        return
    child.terminate()
    try:
        async with asyncio.timeout(_CHILD_GRACE_S):
            await child.wait()
    except TimeoutError:
        child.kill()
        await child.wait()


def _servable(model_dir: Path) -> bool:
    """A finished model built here (random, trained to call tools, or imported by `make-model`; a marker without a
    kind is what an older version left when killed mid-training), or a model of the user's own."""
    built = read_built_model(model_dir)
    if built is not None:
        return built.kind in ("random", "tool-calling", "imported")
    return (model_dir / "config.json").is_file()


def make_local_model(
    model_dir: Path | str, *, spec: TinyModelSpec = LOCAL_MODEL_SPEC, training: ToolTrainingSpec = LOCAL_TRAINING
) -> BuiltModel:
    """Build the tool-calling model with this spec and training into `model_dir`, unless it already holds exactly
    that build (then it is kept: training is deterministic for a seed). `model_dir` may be absent, empty or a model
    built here (of another kind or spec: it is replaced); anything else raises `ModelDirError`, untouched."""
    model_dir = Path(model_dir)
    built = read_built_model(model_dir)
    if _is_build_of(built, spec, training):
        print(f"{model_dir} already holds the tiny model trained to call tools ({training.steps} steps): kept")
        return built
    replacing = f", replacing the {built.kind} model there" if built is not None else ""
    with building(model_dir) as work, EpisodeProcess(spec, training, work) as episodes:
        print(f"building the local tiny model in {model_dir}{replacing} ...", flush=True)
        # Meanwhile the worker makes the tokenizer, draws the episodes and writes the tokenizer into `work`.
        import_qwen3()
        random = write_random_weights(work, spec, episodes.vocab_shape())
        report = train_tool_calling(work, training, episodes=episodes)
        built = dataclasses.replace(
            random, kind="tool-calling", training={"spec": training.to_json(), "report": dataclasses.asdict(report)}
        )
        episodes.tokenizer_written()  # the marker is the build's last file
        record_built_model(work, built)
    short = {name: margin for name, margin in report.agent_margins.items() if margin < training.check_margin}
    print(
        f"trained the tool loop for {report.steps} steps and {report.corrective_steps} corrective step(s) in "
        f"{report.seconds:.0f}s, {'bf16' if report.bfloat16 else 'fp32'} products (loss {report.first_loss:.2f} -> "
        f"{report.final_loss:.2f})"
        + (f"; still short of the check's margin: {short}" if short else ""),
        flush=True,
    )
    return built


def _is_build_of(built: BuiltModel | None, spec: TinyModelSpec, training: ToolTrainingSpec) -> bool:
    return (
        built is not None
        and built.kind == "tool-calling"
        and built.spec == dataclasses.asdict(spec)
        and built.training is not None
        and built.training.get("spec") == training.to_json()
    )


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":  # prepare_local_model's child: build into the directory given
    # A stop ends the build through its cleanup (`building` removes the build directory): SIGTERM from the parent,
    # and Ctrl-C even where the parent was started with SIGINT ignored (a background job), which a child inherits.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ensure_local_model(sys.argv[1])
    # The model is in place and every file of it closed: end without the interpreter's teardown of torch and
    # transformers' 2,600 modules, ~2 s here that the policy stack would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
