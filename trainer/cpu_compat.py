"""Let TRL's `AsyncGRPOTrainer` (trl 1.16) train on a machine without CUDA.

Contract: `apply_cpu_compat()` is idempotent and does nothing when CUDA is available. Otherwise it replaces exactly the
two TRL functions that cannot run on CPU-only torch and returns their names. Everything else that differs on CPU is
configuration, in `CPU_CONFIG`, passed to `AsyncGRPOConfig(**CPU_CONFIG, ...)`:

- `bf16=False`: TRL's config turns bf16 autocast on by default; the engines here serve fp32, and a precision gap
  between trainer and generator biases the importance ratio.
- `use_cpu=True`: keeps accelerate (and `create_model_from_path`'s `device_map`) on the CPU.

The two patches, and why no switch exists for them:

1. `async_grpo_trainer.get_peak_flops_per_device` calls `torch.cuda.get_device_name` unconditionally from
   `AsyncGRPOTrainer.__init__` (for MFU metrics). Replaced by `None`, which TRL already reads as "peak FLOPs unknown,
   MFU metrics off".
2. `packing._flash_attn` loads the FA3 CUDA kernel (`kernels-community/flash-attn3`) behind TRL's packed "tree"
   attention, which `AsyncGRPOTrainer.__init__` hard-codes as the model's `attn_implementation` (passing another
   one in `model_init_kwargs` is a duplicate keyword). Replaced by `varlen_attention`, a plain-torch version of the
   same `flash_attn_varlen_func` call; TRL's own `tree_attention` still builds the paths and shapes.
"""

from __future__ import annotations

import types

import torch

__all__ = ["CPU_CONFIG", "apply_cpu_compat", "varlen_attention"]

TRL_VERSION = "1.16.0"
CPU_CONFIG = types.MappingProxyType({"bf16": False, "use_cpu": True})

_applied: tuple[str, ...] | None = None


def apply_cpu_compat() -> tuple[str, ...]:
    """Patch TRL for CPU-only torch, once; return the patched names (empty when CUDA is available)."""
    global _applied
    if _applied is not None:
        return _applied
    if torch.cuda.is_available():
        _applied = ()
        return _applied

    import trl
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    if trl.__version__ != TRL_VERSION:  # both targets are TRL internals: re-check them on any upgrade
        raise RuntimeError(f"trainer.cpu_compat patches trl {TRL_VERSION}, found trl {trl.__version__}")
    # AsyncGRPOTrainer.__init__ -> get_peak_flops_per_device -> torch.cuda.get_device_name: MFU metrics only.
    async_grpo_trainer.get_peak_flops_per_device = _no_peak_flops
    # packing.tree_attention -> _flash_attn() -> the FA3 CUDA kernel, on every forward of the trained model.
    packing._flash_attn = _torch_flash_attn
    _applied = (
        "trl.experimental.async_grpo.async_grpo_trainer.get_peak_flops_per_device",
        "trl.experimental.async_grpo.packing._flash_attn",
    )
    return _applied


def _no_peak_flops(accelerator, dtype: str) -> None:
    return None


def _torch_flash_attn() -> types.SimpleNamespace:
    return types.SimpleNamespace(flash_attn_varlen_func=varlen_attention)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = None,
) -> torch.Tensor:
    """flash-attn's `flash_attn_varlen_func` in plain torch: `q` (Tq, H, D), `k`/`v` (Tk, Hkv, D) -> (Tq, H, D).

    Segment `s` is queries `cu_seqlens_q[s]:cu_seqlens_q[s+1]` over keys `cu_seqlens_k[s]:cu_seqlens_k[s+1]`. As in
    flash-attn >= 2.1 the causal mask is aligned bottom-right: with Lk >= Lq, query i sees keys j <= i + Lk - Lq.
    That is what TRL's tree packing needs, since a segment's keys are its root-to-segment path, ending with itself.
    `window_size=(left, right)` bounds j to [i + Lk - Lq - left, i + Lk - Lq + right], -1 meaning unbounded.
    Query head h reads key/value head h // (H // Hkv) (grouped-query attention).
    """
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
    left, right = window_size
    outputs = []
    for s in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
        qs = q[q0:q1].transpose(0, 1)  # (H, Lq, D)
        ks = k[k0:k1].transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)  # (H, Lk, D)
        vs = v[k0:k1].transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
        scores = (qs.float() @ ks.float().transpose(1, 2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        # Offset of each query's own position among the keys (bottom-right alignment).
        diagonal = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)
        key_pos = torch.arange(k1 - k0, device=q.device)[None, :]
        visible = torch.ones_like(scores[0], dtype=torch.bool)
        if causal:
            visible &= key_pos <= diagonal
        if left >= 0:
            visible &= key_pos >= diagonal - left
        if right >= 0 and not causal:
            visible &= key_pos <= diagonal + right
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        outputs.append((probs @ vs.float()).to(q.dtype).transpose(0, 1))  # (Lq, H, D)
    return torch.cat(outputs, dim=0)
