"""Publishing the trainer's weights to the policy server: TRL's `WeightTransferProtocol`, three ways.

TRL 1.16's `AsyncGRPOTrainer` calls a transfer synchronously from the thread running `trainer.train()`:
`init_weight_transfer()` once at train begin; then for every sync `pause()`, `send_weights(iter of (name, tensor))`,
`resume()`, after which it bumps its `model_version` and calls the rollout worker's `update_model_version`;
`destroy()` when training ends. The first (cold) sync runs before the worker starts, so agents first see version 1.
The tensors are the live (detached) parameters: they must be copied before `send_weights` returns.

- `LocalEngineTransfer`: the in-process `LocalEngine`, whose API is coroutines on its event loop. Calls are sent to
  that loop with `run_coroutine_threadsafe`, so `trainer.train()` must run on another thread
  (`await asyncio.to_thread(trainer.train)`); calling from the loop's own thread raises instead of deadlocking.
- `ReloadFromDiskTransfer`: any server with vLLM's dev endpoints (vLLM with `VLLM_SERVER_DEV_MODE=1`, or the local
  engine over HTTP). Weights go to a safetensors file, then `/pause` -> `/collective_rpc reload_weights` ->
  `/resume`. The pause is not optional: a reload alone leaves keys and values computed with the old weights in
  vLLM's prefix cache.
- NCCL on GPU is TRL's own `WeightTransferClient`, which the trainer builds when given `weight_transfer=None`.
- `FanOutTransfer`: several replicas of the policy (`interceptor.transport.replicas`), each through its own transfer: every
  one is paused, then each gets the weights, then every one resumes, so wrapped in a `GatedTransfer` no turn is
  generated with the new version before all of them serve it.

`GatedTransfer` wraps any of them so that new agent turns wait (not fail) during the swap and resume tagged with the
new policy version; `interceptor.InterceptionServer` is such a gate. Policy versions count completed syncs, as TRL's
`model_version` does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import requests
import torch
from safetensors.torch import save_file

from trainer.engine import LocalEngine, PauseMode

__all__ = [
    "TIED_RELOAD",
    "FanOutTransfer",
    "GatedTransfer",
    "LocalEngineTransfer",
    "PolicyGate",
    "ReloadFromDiskTransfer",
    "WeightSyncError",
    "WeightTransfer",
    "tied_reload_problem",
]

# TRL's own bounds (`WeightTransferClient._CONTROL_TIMEOUT`, `AsyncGRPOConfig.weight_sync_timeout`): control calls
# are quick; a transfer scales with the model.
CONTROL_TIMEOUT_S = 300.0
TRANSFER_TIMEOUT_S = 1800.0
# Pause modes are vLLM's: "keep" (the default here, and TRL's) freezes in-flight requests and continues them on the
# new weights, "wait" drains them first, "abort" ends them (an agent would see an error).
WEIGHTS_FILE = "model.safetensors"
# Copied next to the weights so the directory is a complete checkpoint (transformers and vLLM can both load it).
CONFIG_FILES = ("config.json", "generation_config.json")

T = TypeVar("T")


TIED_RELOAD = (
    "vLLM (0.31) reloads a tied output head wrong in place: after /collective_rpc reload_weights the input "
    "embeddings are new but the output head keeps the old weights (measured on SmolLM2-135M: 0.1-0.45 nats off the "
    "trained model's logprobs after one small change, 3e-5 when untied), so every sample after the first sync would "
    "be drawn from a policy the trainer does not hold"
)


def tied_reload_problem(model_dir: Path | str) -> str | None:
    """Why weights reloaded from disk into vLLM would not be the trainer's, for the model in `model_dir`; None if
    they would be. A model whose `config.json` ties its word embeddings is refused (see `TIED_RELOAD`)."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text())
    tied = config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False))
    if not tied:
        return None
    return (f"{model_dir} ties its word embeddings, and {TIED_RELOAD}. Train an untied copy (the same logits: "
            "`interceptor make-model smollm2 OUT --untie-embeddings`, or save your model with "
            "tie_word_embeddings=false and its own lm_head), or set allow_tied_reload = true for a vLLM that "
            "reloads tied heads right")


class WeightSyncError(RuntimeError):
    """A weight sync failed; the server (and gate) may still be paused."""


class WeightTransfer(Protocol):
    """TRL's `WeightTransferProtocol` (trl/experimental/async_grpo/async_grpo_trainer.py), restated for typing."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


class PolicyGate(Protocol):
    """Holds new agent turns during a swap; `interceptor.InterceptionServer` implements it."""

    async def pause(self) -> None: ...
    async def resume(self, *, policy_version: int | None = None) -> None: ...


class LocalEngineTransfer:
    """Copies the weights into an in-process `LocalEngine`, between its pause and resume."""

    def __init__(
        self, engine: LocalEngine, *, loop: asyncio.AbstractEventLoop, pause_mode: PauseMode = "keep"
    ) -> None:
        self.engine = engine
        self._loop = loop
        self._pause_mode = pause_mode

    def init_weight_transfer(self) -> None:
        _ = self.engine.weight_version  # raises now, not mid-sync, if the engine is not running

    def pause(self) -> None:
        _run_on(self._loop, self.engine.pause(self._pause_mode), CONTROL_TIMEOUT_S)

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        # Drawn here, on the trainer's thread: the iterator walks the trainer's model. The engine's generation
        # thread has copied the tensors when `update_weights` returns.
        named_tensors = list(iterator)
        _run_on(self._loop, self.engine.update_weights(named_tensors), TRANSFER_TIMEOUT_S)

    def resume(self) -> None:
        _run_on(self._loop, self.engine.resume(), CONTROL_TIMEOUT_S)

    def destroy(self) -> None:
        pass  # the engine belongs to whoever started it


class FanOutTransfer:
    """One transfer to every replica: pause all, send to each, resume all (in the order given)."""

    def __init__(self, transfers: Iterable[WeightTransfer]) -> None:
        self.transfers = list(transfers)
        if not self.transfers:
            raise ValueError("a fan-out needs at least one transfer")

    def init_weight_transfer(self) -> None:
        for transfer in self.transfers:
            transfer.init_weight_transfer()

    def pause(self) -> None:
        for transfer in self.transfers:
            transfer.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        named_tensors = list(iterator)  # the trainer's live parameters: each transfer copies them
        for transfer in self.transfers:
            transfer.send_weights(iter(named_tensors))

    def resume(self) -> None:
        for transfer in self.transfers:
            transfer.resume()

    def destroy(self) -> None:
        for transfer in self.transfers:
            transfer.destroy()


class ReloadFromDiskTransfer:
    """Writes the weights to `weights_dir` and has the server reload them from there (vLLM's dev endpoints).

    `weights_dir` must be dedicated to this transfer and readable by the server's process (it is sent as an absolute
    path): the server reads every `*.safetensors` file in it, and vLLM keeps it as the path of later reloads.
    `config_dir` (the trained checkpoint) supplies `config.json` and `generation_config.json`.
    """

    def __init__(
        self,
        *,
        base_url: str,
        weights_dir: Path | str,
        config_dir: Path | str | None = None,
        pause_mode: PauseMode = "keep",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.weights_dir = Path(weights_dir).absolute()
        self._config_dir = Path(config_dir) if config_dir is not None else None
        self._pause_mode = pause_mode
        self._http = requests.Session()

    def init_weight_transfer(self) -> None:
        self._request("GET", "/health", CONTROL_TIMEOUT_S)
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        for name in CONFIG_FILES:
            if self._config_dir is not None and (self._config_dir / name).is_file():
                shutil.copyfile(self._config_dir / name, self.weights_dir / name)

    def pause(self) -> None:
        self._request("POST", "/pause", CONTROL_TIMEOUT_S, params={"mode": self._pause_mode})

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.save_weights(iterator)
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir)}}
        self._request("POST", "/collective_rpc", TRANSFER_TIMEOUT_S, json=rpc)

    def resume(self) -> None:
        self._request("POST", "/resume", CONTROL_TIMEOUT_S)

    def destroy(self) -> None:
        self._http.close()

    def save_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
        """Write the tensors as one safetensors file (staged, then renamed into place); return its path."""
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
        target = self.weights_dir / WEIGHTS_FILE
        staged = target.with_name(f".{WEIGHTS_FILE}.partial")  # not *.safetensors: never read by a reload
        save_file(tensors, str(staged), metadata={"format": "pt"})
        os.replace(staged, target)
        return target

    def _request(self, method: str, path: str, timeout_s: float, **kwargs: Any) -> None:
        try:
            response = self._http.request(method, f"{self.base_url}{path}", timeout=timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise WeightSyncError(f"{method} {self.base_url}{path} failed: {exc}") from exc
        if response.status_code != 200:
            raise WeightSyncError(
                f"{method} {self.base_url}{path} answered {response.status_code}: {response.text[:500]}"
            )


class GatedTransfer:
    """Any `WeightTransfer` with a `PolicyGate` closed around the swap.

    Order: gate closed (no new turns reach the server), server paused, weights sent, server resumed, gate opened with
    the new policy version. Works around TRL's own NCCL client too: build the trainer with `weight_transfer=None`,
    then `trainer.weight_transfer = GatedTransfer(trainer.weight_transfer, ...)` before `train()`.
    """

    def __init__(
        self, inner: WeightTransfer, *, gate: PolicyGate, loop: asyncio.AbstractEventLoop, policy_version: int = 0
    ) -> None:
        self.inner = inner
        self._gate = gate
        self._loop = loop
        self.policy_version = policy_version  # completed syncs; set it when resuming from a checkpoint, as TRL does

    def init_weight_transfer(self) -> None:
        self.inner.init_weight_transfer()

    def pause(self) -> None:
        _run_on(self._loop, self._gate.pause(), CONTROL_TIMEOUT_S)
        self.inner.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.inner.send_weights(iterator)

    def resume(self) -> None:
        self.inner.resume()
        self.policy_version += 1
        _run_on(self._loop, self._gate.resume(policy_version=self.policy_version), CONTROL_TIMEOUT_S)

    def destroy(self) -> None:
        self.inner.destroy()


def _run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run `coro` on `loop` (another thread's) and wait for its result."""
    if _is_current_loop(loop):
        coro.close()
        raise WeightSyncError(
            "a weight sync was called on the event loop it has to wait for, which would deadlock; run "
            "trainer.train() in another thread (e.g. `await asyncio.to_thread(trainer.train)`)"
        )
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout_s)
    except TimeoutError as exc:
        future.cancel()
        raise WeightSyncError(f"weight sync step did not finish within {timeout_s:.0f} s") from exc


def _is_current_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop on this thread: the trainer's thread, as intended
        return False
