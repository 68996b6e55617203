"""The embedded default's tokenizer and episodes, made in a process of their own while the build's own process
imports torch and writes the random weights (`trainer.models.local_model`).

Before the first step a build spent ~19 s on one core: Qwen's tokenizer (converting its BPE ranks), the random
weights (mostly importing torch and transformers' Qwen3 modelling) and the 72 steps' episodes (chat templates and
encodes). The tokenizer and the episodes need neither torch nor the weights, and the weights need only the
tokenizer's size and two of its ids, so they run side by side on two cores here.

`EpisodeProcess` answers as the build's `EpisodeMaker` (`train_tool_calling(episodes=...)`): the worker holds the one
maker, so every episode is drawn in the order and from the generator state an in-process build draws it, and the
build is bitwise the one it was. Its first requests are sent at once: the tokenizer (whose shape the weights wait
for), the main steps, then the tokenizer's files written into the build's directory, so the worker is never idle
while the build waits; later requests (the check's episodes, a corrective step's) are answered in turn. An error in
the worker comes back as its own exception, with the worker's traceback as a note; the worker is stopped when the
block ends, whichever way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.models.tiny_model import TinyModelSpec, VocabShape, tiny_tokenizer, vocab_shape

if TYPE_CHECKING:
    from trainer.models.tool_model import ToolTrainingSpec
    from trainer.models.tool_steps import Episode, Step

__all__ = ["EpisodeProcess", "EpisodeWorkerGone"]

_STOP_GRACE_S = 10.0


class EpisodeWorkerGone(RuntimeError):
    """The worker process ended without answering (killed, or out of memory)."""


class EpisodeProcess:
    """A worker process that makes the tokenizer for `model_spec`, draws `training`'s episodes with it, and writes
    the tokenizer into `directory`; a context manager (the worker ends with the block)."""

    def __init__(self, model_spec: TinyModelSpec, training: ToolTrainingSpec, directory: Path) -> None:
        # A fresh interpreter (no torch, none of the caller's state), started as `python -m` so that it imports
        # nothing of the caller's main module (multiprocessing's spawn would, and fail without a main guard).
        ours, theirs = socket.socketpair()
        path = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))))
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "trainer.models.episode_process", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": path},
            )
        self._conn = Connection(ours.detach())
        self._sent = 0
        self._read = 0
        self._early: dict[int, tuple[bool, Any]] = {}
        self._shape = self._send("tokenizer", model_spec, training)
        self._main = (training.steps, self._send("steps", training.steps))
        self._saved: int | None = self._send("save_tokenizer", str(directory))
        self._facts: dict[str, Any] = {}  # digits, agents: asked once

    def __enter__(self) -> EpisodeProcess:
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self.tokenizer_written()
        finally:
            self._stop(wait=kind is None)

    # ---- what the build asks

    def tokenizer_written(self) -> None:
        """Once the tokenizer's files are in the build's directory."""
        if self._saved is not None:
            self._answer(self._saved)
            self._saved = None

    def vocab_shape(self) -> VocabShape:
        return self._answer(self._shape)

    def steps(self, count: int) -> list[Step]:
        planned, ticket = self._main
        if count == planned and ticket is not None:
            self._main = (planned, None)
            return self._answer(ticket)
        return self._ask("steps", count)

    def vocabulary(self) -> set[int]:
        return self._ask("vocabulary")

    def aliases(self) -> list[tuple[int, int]]:
        return self._ask("aliases")

    @property
    def digits(self) -> list[int]:
        return self._fact("digits")

    @property
    def agents(self) -> int:
        return self._fact("agents")

    def step(self, agent: int | None = None) -> Step:
        return self._ask("step", agent)

    def response_step(self, responses: tuple[str, ...]) -> Step:
        return self._ask("response_step", responses)

    def agent_episodes(self, agent: int, count: int, *, exact: bool = False) -> list[Episode]:
        return self._ask("agent_episodes", agent, count, exact)

    def response_checks(self, count: int, *, seed: int) -> list[list[Episode]]:
        return self._ask("response_checks", count, seed)

    def first_turn_step(self) -> Step:
        return self._ask("first_turn_step")

    def first_turn_checks(self, count: int, *, seed: int) -> list[Episode]:
        return self._ask("first_turn_checks", count, seed)

    # ---- the pipe: requests are answered in the order they were sent

    def _send(self, name: str, *args) -> int:
        self._conn.send((name, args))
        self._sent += 1
        return self._sent - 1

    def _ask(self, name: str, *args) -> Any:
        return self._answer(self._send(name, *args))

    def _fact(self, name: str) -> Any:
        if name not in self._facts:
            self._facts[name] = self._ask(name)
        return self._facts[name]

    def _answer(self, ticket: int) -> Any:
        while ticket not in self._early:
            try:
                self._early[self._read] = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise EpisodeWorkerGone(
                    f"the tool model's episode worker ended (exit code {self._process.poll()}) without answering"
                ) from exc
            self._read += 1
        ok, value = self._early.pop(ticket)
        if not ok:
            raise value
        return value

    def _stop(self, *, wait: bool) -> None:
        """End the worker: once it is idle (every answer read, its pipe closed), or at once (the build failed or
        was stopped: nothing the worker would still write is wanted, and the build's directory is removed next)."""
        self._conn.close()  # the worker's next read ends it
        if wait:
            try:
                self._process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()


def _serve(conn: Connection) -> None:
    """The worker: answer each request in turn until the pipe closes."""
    from trainer.models.tool_episodes import EpisodeMaker

    tokenizer = maker = None
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if name == "tokenizer":
                model_spec, training = args
                tokenizer = tiny_tokenizer(model_spec)
                maker = EpisodeMaker(tokenizer, training)
                value: object = vocab_shape(tokenizer)
            elif name == "save_tokenizer":
                tokenizer.save_pretrained(args[0])
                value = None
            elif name in ("digits", "agents"):
                value = getattr(maker, name)
            elif name == "agent_episodes":
                value = maker.agent_episodes(args[0], args[1], exact=args[2])
            elif name in ("response_checks", "first_turn_checks"):
                value = getattr(maker, name)(args[0], seed=args[1])
            else:
                value = getattr(maker, name)(*args)
            answer = (True, value)
        except Exception as exc:  # noqa: BLE001 - sent back and raised in the build's process
            exc.add_note("in the tool model's episode worker:\n" + traceback.format_exc())
            answer = (False, exc)
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # an exception that does not pickle
            conn.send((False, RuntimeError(f"{type(exc).__name__} in the tool model's episode worker: {exc}")))


def _end_with(parent: int) -> None:
    """Linux: this process is killed when the build's process ends, however it ends (kill -9 included), instead of
    drawing on until it reads the closed pipe."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe ends it
        return
    if os.getppid() != parent:  # the build's process ended before that
        os._exit(1)


if __name__ == "__main__":  # EpisodeProcess's worker: its end of the socket and the build's process id
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the build's process decides
    _end_with(int(sys.argv[2]))
    _serve(Connection(int(sys.argv[1])))
