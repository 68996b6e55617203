"""The trainer-vs-generator logprob gap of every step: |log p_trainer - log p_generator| over its sampled tokens.

At ratio time (the loss's forward pass, before the step's update) the trainer scores each sampled token with the
weights it trains; the sample carries the logprob the generator sampled it with. With the same weights and the
same precision the two agree to rounding (the CPU path here: < 1e-5). A precision mismatch (a bf16 trainer and an
fp32 generator, `precision.py`), another attention kernel, or samples from older policy versions (up to
`max_staleness` behind) show as a gap, and the gap biases the importance ratio, so users should see it before it
hurts. `with_logprob_gap(AsyncGRPOTrainer)` is the trainer class that logs `logprob_gap/mean` and
`logprob_gap/max` with the step's other metrics (`metrics.jsonl`), over all of the step's micro-batches (the mean
is pushed as a (sum, count) pair and the max under a `max` name, which TRL's logging reduces as such).

The gap is read from TRL's own forward output (`log_probs`, which its fused LM head returns) through a forward hook
on the model for the duration of `compute_loss`: TRL's loss is computed unchanged.
"""

from __future__ import annotations

from functools import cache

import torch

__all__ = ["with_logprob_gap"]


@cache
def with_logprob_gap(trainer_class: type) -> type:
    """`trainer_class` (TRL's `AsyncGRPOTrainer`) that also logs the logprob gap of each step."""

    class LogprobGapTrainer(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            selected = inputs["token_index"] >= 0
            index, old = inputs["token_index"][selected], inputs["old_log_probs"][selected]

            def record(module, args, output) -> None:
                log_probs = getattr(output, "log_probs", None)
                if log_probs is not None and index.numel():
                    with torch.no_grad():
                        self._log_gap((log_probs.flatten()[index].float() - old.float()).abs())

            handle = model.register_forward_hook(record)
            try:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            finally:
                handle.remove()

        def _log_gap(self, gap: torch.Tensor) -> None:
            totals = self.accelerator.reduce(torch.stack([gap.sum(), gap.new_tensor(float(gap.numel()))]), "sum")
            largest = self.accelerator.gather(gap.max().reshape(1)).max()
            metrics = self._metrics["train"]
            metrics["logprob_gap/mean"].append((totals[0].item(), totals[1].item()))
            metrics["logprob_gap/max"].append(largest.item())

    LogprobGapTrainer.__name__ = LogprobGapTrainer.__qualname__ = f"LogprobGap{trainer_class.__name__}"
    return LogprobGapTrainer
