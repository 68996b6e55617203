"""The reference the engine's logprobs are checked against: one plain forward pass over prompt + completion."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["teacher_forced_logprobs"]


def teacher_forced_logprobs(
    model, prompt: Sequence[int], completion: Sequence[int], *, temperature: float = 1.0
) -> list[float]:
    """log p(completion[i] | prompt + completion[:i]) from one forward pass over the whole sequence."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[*prompt, *completion]])).logits[0].float()
    logprobs = (logits / temperature).log_softmax(dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(completion)]
