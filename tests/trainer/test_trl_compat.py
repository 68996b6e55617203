"""TRL's AsyncGRPOTrainer trains on CPU-only torch with `trainer.rl.trl_compat`, with the attention it resolves.

The trainer gets the tiny model, a rollout worker whose queue is pre-filled with hand-made `RolloutSample`s (TRL's
own class), and a transfer that records what it is asked. The samples' old logprobs come from a teacher-forced pass
of the same weights, so the first step's importance ratio must be 1 and its logprob gap 0: that checks the torch
varlen attention against the model's own attention over each path, the packing of shared prompts and the logprob
alignment together.
"""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer.teacher_forcing import teacher_forced_logprobs
from trainer.rl.logprob_gap import with_logprob_gap
from trainer.rl.trl_compat import (
    CPU_CONFIG, AttentionUnavailable, apply_trl_compat, resolve_attention, varlen_attention,
)
from trainer.rl.weight_sync import LocalEngineTransfer

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")

PROMPTS = ([11, 12, 13, 14, 15], [21, 22, 23, 24])
# Two turns with a tool result between them: mask 1, 0, 1. Every pair of completions shares its group's prompt.
TURN, TOOL_RESULT = 4, 3
STEPS, SAMPLES_PER_STEP = 2, 4
# accelerate's dispatcher reads one micro-batch ahead of the step it is training on.
MICRO_BATCHES_READ = STEPS + 1


class QueuedWorker:
    """TRL's rollout-worker protocol over a pre-filled queue, recording what the trainer tells it."""

    def __init__(self, samples) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.events: list[tuple] = []
        for sample in samples:
            self.rollout_buffer.put(sample)

    def start(self) -> None:
        self.events.append(("start",))

    def stop(self) -> None:
        self.events.append(("stop",))

    def update_model_version(self, model_version: int) -> None:
        self.events.append(("version", model_version))

    def check_health(self, stale_after_s: float) -> None:
        raise AssertionError("the queue ran dry: the trainer wanted more samples than the test provides")


class RecordingTransfer:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def init_weight_transfer(self) -> None:
        self.calls.append(("init",))

    def pause(self) -> None:
        self.calls.append(("pause",))

    def send_weights(self, iterator) -> None:
        self.calls.append(("send", sorted(name for name, _ in iterator)))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def destroy(self) -> None:
        self.calls.append(("destroy",))


def make_samples(model, rng: np.random.Generator, *, shift: float = 0.0) -> list:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    samples = []
    for index in range(MICRO_BATCHES_READ * SAMPLES_PER_STEP):
        group = index // 2
        prompt = list(PROMPTS[group % 2])
        completion = rng.integers(30, 600, size=2 * TURN + TOOL_RESULT).tolist()
        mask = [0] * len(prompt) + [1] * TURN + [0] * TOOL_RESULT + [1] * TURN
        logprobs = [0.0] * len(prompt) + teacher_forced_logprobs(model, prompt, completion)
        samples.append(
            RolloutSample(
                prompt=[{"role": "user", "content": f"task {group}"}],
                completion=[{"role": "assistant", "content": "..."}],
                input_ids=np.array(prompt + completion, dtype=np.int64),
                completion_mask=np.array(mask, dtype=np.int64),
                old_log_probs=np.array([lp + shift if m else 0.0 for lp, m in zip(logprobs, mask)], dtype=np.float32),
                advantage=1.0 if index % 2 else -1.0,
                model_version=0,
                group_id=group,
                metrics={"reward": float(index % 2)},
            )
        )
    return samples


def build_trainer(model_dir: Path, output_dir: Path, *, worker, transfer, callbacks=()):
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    args = AsyncGRPOConfig(
        **CPU_CONFIG,
        output_dir=str(output_dir),
        max_steps=STEPS,
        per_device_train_batch_size=SAMPLES_PER_STEP,
        token_budget=0,  # fixed sample count per step; None would ask a vLLM server for its max_model_len
        learning_rate=1e-3,
        activation_checkpointing=False,  # transformers 5 name of `gradient_checkpointing` (TRL defaults it on)
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    return with_logprob_gap(AsyncGRPOTrainer)(
        model=str(model_dir),
        args=args,
        # Required even with a custom worker; with `max_steps` set its rows are never read.
        train_dataset=Dataset.from_dict({"prompt": ["unused: the worker owns the prompts"]}),
        rollout_worker=worker,
        weight_transfer=transfer,
        callbacks=list(callbacks),
    )


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_async_grpo_trains_two_steps_on_cpu(tiny_model_dir: Path, initial_model, tmp_path: Path):
    from transformers import TrainerCallback

    assert apply_trl_compat(resolve_attention("auto"))  # something to patch on CPU-only torch
    worker = QueuedWorker(make_samples(initial_model, np.random.default_rng(0)))
    transfer = RecordingTransfer()
    logged: list[dict] = []

    class KeepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs or {}))

    trainer = build_trainer(tiny_model_dir, tmp_path, worker=worker, transfer=transfer, callbacks=[KeepLogs()])
    trainer.train()

    first_step = next(entry for entry in logged if "ratio" in entry)
    assert first_step["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert abs(first_step["kl"]) < 1e-6
    assert 0 <= first_step["logprob_gap/mean"] <= first_step["logprob_gap/max"] < 1e-5  # same weights, same dtype

    trained = dict(trainer.model.named_parameters())
    for name, before in initial_model.named_parameters():
        assert not torch.equal(trained[name].detach(), before), f"{name} did not change"

    assert worker.events == [("version", 1), ("start",), ("version", 2), ("version", 3), ("stop",)]
    names = sorted(name for name, _ in initial_model.named_parameters())
    sync = [("pause",), ("send", names), ("resume",)]
    assert transfer.calls == [("init",), *sync * (STEPS + 1), ("destroy",)]


async def test_training_on_a_thread_publishes_every_step_to_the_local_engine(
    tiny_model_dir: Path, initial_model, engine, tmp_path: Path
):
    apply_trl_compat()
    worker = QueuedWorker(make_samples(initial_model, np.random.default_rng(1)))
    transfer = LocalEngineTransfer(engine, loop=asyncio.get_running_loop())
    trainer = build_trainer(tiny_model_dir, tmp_path, worker=worker, transfer=transfer)

    # The engine's loop (this one) stays free to serve the syncs the trainer's thread sends it.
    await asyncio.to_thread(trainer.train)

    assert engine.weight_version == STEPS + 1  # the cold sync, then one per step
    served = engine.core.policy.model.state_dict()
    for name, param in trainer.model.named_parameters():
        assert torch.equal(served[name], param.detach()), name


def test_the_logprob_gap_reports_how_far_the_generators_logprobs_are(tiny_model_dir: Path, initial_model,
                                                                     tmp_path: Path):
    """Old logprobs 0.25 above the trainer's (as a generator in another precision would give): the gap says so."""
    from transformers import TrainerCallback

    apply_trl_compat()
    worker = QueuedWorker(make_samples(initial_model, np.random.default_rng(2), shift=0.25))
    logged: list[dict] = []

    class KeepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs or {}))

    trainer = build_trainer(tiny_model_dir, tmp_path, worker=worker, transfer=RecordingTransfer(),
                            callbacks=[KeepLogs()])
    trainer.train()
    first_step = next(entry for entry in logged if "logprob_gap/mean" in entry)
    assert first_step["logprob_gap/mean"] == pytest.approx(0.25, abs=1e-4)
    assert first_step["logprob_gap/max"] == pytest.approx(0.25, abs=1e-4)


def test_apply_trl_compat_is_idempotent():
    assert apply_trl_compat() == apply_trl_compat()


def test_auto_attention_is_torch_on_a_machine_without_cuda():
    attention = resolve_attention("auto")
    assert attention.name == "torch" and "no CUDA device" in attention.reason
    with pytest.raises(AttentionUnavailable, match="no CUDA device"):
        resolve_attention("fa3")
    assert resolve_attention("torch").name == "torch"
    with pytest.raises(ValueError, match="attention must be one of"):
        resolve_attention("flash")


def test_auto_attention_is_torch_on_a_hopper_gpu_without_the_kernels_package(monkeypatch):
    """What `auto` decides on an H100 whose environment lacks `kernels` (the GPU is simulated: only the decision)."""
    import importlib.util

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "kernels" else real_find_spec(name, *a))
    attention = resolve_attention("auto")
    assert attention.name == "torch" and "`kernels` package is not installed" in attention.reason
    assert "interceptor[gpu]" in attention.reason
    with pytest.raises(AttentionUnavailable, match="kernels"):
        resolve_attention("fa3")


def test_fa3_is_refused_on_a_gpu_older_than_hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(AttentionUnavailable, match="A100.*not a Hopper GPU"):
        resolve_attention("fa3")
    assert resolve_attention("auto").name == "torch"


def test_varlen_attention_matches_causal_attention_over_each_path():
    """Two segments: a 3-token chain, and a 2-token branch whose keys are its 3-token parent path plus itself."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    q = torch.randn(5, heads, dim)
    k = torch.randn(5, kv_heads, dim)
    v = torch.randn(5, kv_heads, dim)
    paths = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4])  # segment 0 sees itself; segment 1 sees 0..2 then itself
    out = varlen_attention(
        q, k[paths], v[paths], torch.tensor([0, 3, 5]), torch.tensor([0, 3, 8]), 3, 5, softmax_scale=dim**-0.5
    )

    def reference(rows: list[int]) -> torch.Tensor:
        qs, ks, vs = (x[rows].transpose(0, 1) for x in (q, k, v))
        attended = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        return attended.transpose(0, 1)

    torch.testing.assert_close(out[:3], reference([0, 1, 2]))
    torch.testing.assert_close(out[3:], reference([0, 1, 2, 3, 4])[3:])


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("window", [(-1, -1), (2, 0)])
def test_varlen_attention_matches_an_explicit_softmax_with_windows_and_softcap(softcap, window):
    torch.manual_seed(1)
    heads, kv_heads, dim = 4, 2, 8
    q, k, v = torch.randn(7, heads, dim), torch.randn(9, kv_heads, dim), torch.randn(9, kv_heads, dim)
    cu_q, cu_k = torch.tensor([0, 4, 7]), torch.tensor([0, 4, 9])
    out = varlen_attention(q, k, v, cu_q, cu_k, 4, 5, softmax_scale=0.3, window_size=window, softcap=softcap)
    for (q0, q1), (k0, k1) in zip(((0, 4), (4, 7)), ((0, 4), (4, 9))):
        qs = q[q0:q1].transpose(0, 1)
        ks, vs = (x[k0:k1].transpose(0, 1).repeat_interleave(2, dim=0) for x in (k, v))
        scores = qs @ ks.transpose(1, 2) * 0.3
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        diagonal = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        keys = torch.arange(k1 - k0)[None, :]
        visible = (keys <= diagonal) & ((keys >= diagonal - window[0]) if window[0] >= 0 else True)
        expected = (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vs).transpose(0, 1)
        torch.testing.assert_close(out[q0:q1], expected)
