"""What `interceptor train` wires between the policy stack and TRL's trainer: checks on the policy servers before a
step is taken, the way weights reach them, and TRL's `AsyncGRPOConfig` from the training config."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.train_main import TrainConfig

__all__ = ["TiedReloadRefused", "check_the_policy_servers", "grpo_args", "weight_transfer"]


class TiedReloadRefused(ValueError):
    """Weights would be reloaded into vLLM for a model with tied embeddings (`weight_sync.TIED_RELOAD`)."""


async def check_the_policy_servers(config: TrainConfig, urls: list[str], *, attention, dtype: str,
                                    engine_device: str | None, model_dir) -> None:
    """Write `setup.json` (attention, both dtypes, device, model) and refuse what would train on wrong numbers: a
    generator serving another dtype (unless allowed), a tied model reloaded into a policy server (unless allowed)."""
    from trainer.rl.precision import DtypeMismatch, dtype_mismatch, generator_dtype
    from trainer.rl.weight_sync import tied_reload_problem

    served = [await generator_dtype(url) for url in urls]
    mismatch = next((m for m in (dtype_mismatch(dtype, s) for s in served) if m), None)
    setup = {"attention": attention.name, "attention_reason": attention.reason, "trainer_dtype": dtype,
             "generator_dtype": served[0] if len(set(served)) == 1 else served, "dtype_mismatch": mismatch,
             "engine_device": engine_device, "model": str(Path(model_dir).resolve()) if model_dir else None}
    (config.out / "setup.json").write_text(json.dumps(setup, indent=2) + "\n")
    generator = setup["generator_dtype"] or "not reported"
    print(f"attention: {attention.reason}; dtype: trainer {dtype}, generator {generator}", flush=True)
    if mismatch and not config.allow_dtype_mismatch:
        raise DtypeMismatch(mismatch + " (or set allow_dtype_mismatch = true)")
    if mismatch:
        print(f"warning: {mismatch}", flush=True)
    if engine_device is None and config.weight_sync == "reload" and not config.allow_tied_reload:
        if problem := tied_reload_problem(model_dir):
            raise TiedReloadRefused(problem)


def weight_transfer(config: TrainConfig, engine, urls: list[str], *, model_dir, loop):
    """How weights reach the policy server(s): into the in-process engine, from disk into each vLLM replica, or
    None for TRL's own NCCL client (built by the trainer; it needs vLLM importable here)."""
    from trainer.rl.weight_sync import FanOutTransfer, LocalEngineTransfer, ReloadFromDiskTransfer

    if engine is not None:
        return LocalEngineTransfer(engine, loop=loop)
    if config.weight_sync == "nccl":
        return None
    if len(urls) == 1:
        return ReloadFromDiskTransfer(base_url=urls[0], weights_dir=config.out / "weights", config_dir=model_dir)
    return FanOutTransfer(  # every replica reloads the same files, each from its own directory
        ReloadFromDiskTransfer(base_url=url, weights_dir=config.out / "weights" / str(i), config_dir=model_dir)
        for i, url in enumerate(urls))


def grpo_args(config: TrainConfig, *, dtype: str, on_cpu: bool, nccl_url: str | None):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from trainer.rl.trl_compat import CPU_CONFIG

    return AsyncGRPOConfig(
        **(CPU_CONFIG if on_cpu else {"bf16": dtype == "bfloat16", "fp16": dtype == "float16"}),
        dtype=dtype,
        output_dir=str(config.out / "trainer"),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.samples_per_step,
        token_budget=0,
        learning_rate=config.learning_rate,
        max_staleness=config.max_staleness,
        temperature=config.temperature,
        activation_checkpointing=False,
        report_to="trackio" if importlib.util.find_spec("trackio") is not None else "none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=config.seed,
        **({"vllm_server_base_url": nccl_url.rstrip("/").removesuffix("/v1")} if nccl_url else {}),
    )
