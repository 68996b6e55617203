"""What TRL's `AsyncGRPOTrainer` (trl 1.16) needs to train on this machine, applied by capability.

TRL hard-codes two things that do not run everywhere:

1. Packed "tree" attention through the FA3 kernel. `AsyncGRPOTrainer.__init__` sets the model's
   `attn_implementation` to TRL's `tree_attention` (another one in `model_init_kwargs` is a duplicate keyword),
   which calls `packing._flash_attn().flash_attn_varlen_func`, and `_flash_attn` loads
   `kernels-community/flash-attn3` through the `kernels` package: from the Hub (or its local cache), on Hopper
   GPUs only. Without `kernels`, offline, on a CPU or on any other GPU the first forward pass fails.
2. `get_peak_flops_per_device` (MFU metrics, from `__init__`) calls `torch.cuda.get_device_name` unconditionally.

`resolve_attention(choice)` decides which attention the trainer runs, `apply_trl_compat(attention)` makes TRL use
it. The choice (`TrainConfig.attention`):

- `"fa3"`: TRL's own kernel; refused with the fix named when it cannot load (no CUDA, not Hopper, no `kernels`,
  kernel not fetchable).
- `"torch"`: `varlen_attention` below, the same `flash_attn_varlen_func` contract in plain torch (each packed
  segment through `scaled_dot_product_attention` with its bottom-right causal mask), on CPU and CUDA alike.
- `"auto"`: `"fa3"` when it loads, else `"torch"`, with the reason.

Everything else that differs on CPU is configuration, in `CPU_CONFIG`, passed to `AsyncGRPOConfig`: `bf16=False`
(TRL turns bf16 autocast on by default; the trainer's precision must match the generator's, `precision.py`) and
`use_cpu=True` (keeps accelerate and `create_model_from_path`'s `device_map` on the CPU).

Both patch targets are TRL internals: they are checked against the pinned TRL version on every application.
"""

from __future__ import annotations

import importlib.util
import types
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "ATTENTION_CHOICES", "CPU_CONFIG", "Attention", "AttentionUnavailable", "apply_trl_compat", "resolve_attention",
    "varlen_attention",
]

TRL_VERSION = "1.16.0"
CPU_CONFIG = types.MappingProxyType({"bf16": False, "use_cpu": True})
ATTENTION_CHOICES = ("auto", "fa3", "torch")
_FA3_CAPABILITY = (9, 0)  # FA3 is built for Hopper (sm_90)
_GPU_EXTRA = "pip install 'interceptor[gpu]' (the `kernels` package)"

AttentionName = Literal["fa3", "torch"]


class AttentionUnavailable(RuntimeError):
    """The attention asked for cannot run here; the message says why and what fixes it."""


@dataclass(frozen=True)
class Attention:
    name: AttentionName
    reason: str  # why this one (printed at train start)


def resolve_attention(choice: str = "auto") -> Attention:
    """The attention the trainer will run for `choice` ("auto", "fa3" or "torch")."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, not {choice!r}")
    if choice == "torch":
        return Attention("torch", "asked for: torch varlen attention")
    problem = _fa3_problem()
    if problem is None:
        return Attention("fa3", "TRL's FA3 kernel loads on this GPU")
    if choice == "fa3":
        raise AttentionUnavailable(f"attention = 'fa3' cannot run here: {problem}. Use attention = 'torch' "
                                   f"(or 'auto'), or fix that.")
    return Attention("torch", f"torch varlen attention, since FA3 cannot run here: {problem}")


def _fa3_problem() -> str | None:
    """Why TRL's FA3 kernel cannot run here, or None when it loads."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.version.hip is None and torch.cuda.get_device_capability() < _FA3_CAPABILITY:
        name = torch.cuda.get_device_name()
        return f"{name} is not a Hopper GPU (FA3 needs compute capability 9.0)"
    if importlib.util.find_spec("kernels") is None:
        return f"the `kernels` package is not installed ({_GPU_EXTRA})"
    try:
        _check_trl()
        from trl.experimental.async_grpo import packing

        packing._flash_attn()  # cached by TRL: the kernel the trainer will use
    except Exception as exc:  # offline without the kernel in the Hub cache, a build for another torch, ...
        return f"the FA3 kernel did not load ({type(exc).__name__}: {str(exc)[:200]})"
    return None


_applied: dict[str, tuple[str, ...]] = {}


def apply_trl_compat(attention: Attention | None = None) -> tuple[str, ...]:
    """Make TRL run `attention` (default: `resolve_attention("auto")`) and, without CUDA, skip its MFU device
    query; return the patched names. Idempotent; switching attention between calls is refused (a trainer built
    meanwhile would run the other one)."""
    attention = attention or resolve_attention("auto")
    if _applied:
        (name, patched), = _applied.items()
        if name != attention.name:
            raise RuntimeError(f"TRL already runs {name} attention in this process; cannot switch to {attention.name}")
        return patched
    _check_trl()
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    patched: list[str] = []
    if not torch.cuda.is_available():
        # AsyncGRPOTrainer.__init__ -> get_peak_flops_per_device -> torch.cuda.get_device_name: MFU metrics only;
        # None is what TRL reads as "peak FLOPs unknown".
        async_grpo_trainer.get_peak_flops_per_device = _no_peak_flops
        patched.append("trl.experimental.async_grpo.async_grpo_trainer.get_peak_flops_per_device")
    if attention.name == "torch":
        # packing.tree_attention -> _flash_attn() -> the FA3 kernel, on every forward of the trained model.
        packing._flash_attn = _torch_flash_attn
        patched.append("trl.experimental.async_grpo.packing._flash_attn")
    _applied[attention.name] = tuple(patched)
    return _applied[attention.name]


def _check_trl() -> None:
    import trl

    if trl.__version__ != TRL_VERSION:  # the patch targets are TRL internals: re-check them on any upgrade
        raise RuntimeError(f"trainer.rl.trl_compat patches trl {TRL_VERSION}, found trl {trl.__version__}")


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
    Query head h reads key/value head h // (H // Hkv) (grouped-query attention). Scores and softmax run in fp32
    (as flash-attn accumulates), the output is in `q`'s dtype. Softcapping has no fused kernel: those segments
    take the explicit path.
    """
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
    left, right = window_size
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outputs = []
    for s in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[s], bounds_q[s + 1], bounds_k[s], bounds_k[s + 1]
        qs = q[q0:q1].transpose(0, 1).float()  # (H, Lq, D)
        ks = k[k0:k1].transpose(0, 1).float()  # (Hkv, Lk, D)
        vs = v[k0:k1].transpose(0, 1).float()
        # Offset of each query's own position among the keys (bottom-right alignment).
        diagonal = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)
        key_pos = torch.arange(k1 - k0, device=q.device)[None, :]
        visible = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device)
        if causal:
            visible &= key_pos <= diagonal
        if left >= 0:
            visible &= key_pos >= diagonal - left
        if right >= 0 and not causal:
            visible &= key_pos <= diagonal + right
        if softcap:
            ks, vs = (x.repeat_interleave(heads // kv_heads, dim=0) for x in (ks, vs))
            scores = softcap * torch.tanh((qs @ ks.transpose(1, 2)) * scale / softcap)
            attended = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1) @ vs
        else:
            attended = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=visible, scale=scale, enable_gqa=heads != kv_heads
            )
        outputs.append(attended.to(q.dtype).transpose(0, 1))  # (Lq, H, D)
    return torch.cat(outputs, dim=0)
