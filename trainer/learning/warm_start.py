"""A supervised warm-start: a short SFT (TRL's `SFTTrainer`) on the worked solutions of a family's training split,
for a family the imported model cannot start on (GRPO has no signal at 0% success). Its effect is a figure of its
own: held-out success is measured before it, after it, and after GRPO from the warm-started model.

    python examples/agents/simple_agent.py --shots RUN/tasks/shots.json --print-prefix > RUN/tasks/prefix.json
    interceptor warm-start runs/smollm2/model RUN/warm --gold RUN/tasks/train_gold.jsonl \
        --prefix RUN/tasks/prefix.json --transcripts 32

`train_gold.jsonl` (`interceptor make-tasks`) holds one worked solution per training task, never a held-out one.
`prefix.json` is what the agent puts before every task: `{"messages": [...], "tools": [...]}` (its system turn and
worked examples, and the tools it offers), so the model is taught in the context it will act in.

Each assistant turn of a solution is one row: the prompt is the prefix, the task and the solution before that turn,
rendered by the model's own chat template with the tools (as the gate renders a request); the completion is that
turn, rendered the same way. The rows are tokenized here, so a template that does not extend the prompt's tokens
is an error, not a warning, and the loss is on the completion's tokens only (`completion_only_loss`). The output
directory is a checkpoint like `interceptor train`'s `final/`: weights, tokenizer, chat template.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["WarmStartConfig", "add_warm_start_arguments", "run_warm_start_from_args", "training_rows", "warm_start"]


@dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
    model: Path  # the checkpoint to start from
    out: Path
    gold: Path  # train_gold.jsonl: {"task_id", "messages"} per training task
    prefix: Path  # {"messages": [...], "tools": [...]}: what the agent puts before every task
    transcripts: int = 32  # how many solutions to learn from (the first ones of the file)
    epochs: int = 1
    learning_rate: float = 2e-5
    batch_size: int = 4  # rows per optimizer step (gradient accumulation over single rows)
    seed: int = 0
    threads: int | None = None  # torch threads; None: torch's default

    def __post_init__(self) -> None:
        if self.transcripts < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("transcripts, epochs and batch_size must be at least 1")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, not {self.learning_rate}")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"{self.model} is not a model directory (no config.json)")


def _read_prefix(path: Path) -> tuple[list[dict], list[dict]]:
    prefix = json.loads(Path(path).read_text(encoding="utf-8"))
    messages, tools = prefix.get("messages") if isinstance(prefix, dict) else None, prefix.get("tools", [])
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"{path}: expected {{\"messages\": [chat messages], \"tools\": [...]}}")
    if not isinstance(tools, list):
        raise ValueError(f"{path}: tools must be a list")
    return messages, tools


def _read_gold(path: Path, count: int) -> list[list[dict]]:
    solutions = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not any(m.get("role") == "assistant" for m in messages):
            raise ValueError(f"{path}:{number}: expected {{\"task_id\", \"messages\"}} with an assistant turn")
        solutions.append(messages)
        if len(solutions) == count:
            break
    if len(solutions) < count:
        raise ValueError(f"{path} holds {len(solutions)} solutions; {count} were asked for")
    return solutions


def training_rows(tokenizer, solutions: list[list[dict]], prefix: list[dict], tools: list[dict]) -> list[dict]:
    """One row per assistant turn: `input_ids` (the rendered prompt, then the turn) and `completion_mask` (1 on the
    turn's tokens). Raises if the template renders the prompt differently once the turn follows it."""
    rows = []
    for solution in solutions:
        for index, message in enumerate(solution):
            if message["role"] != "assistant":
                continue
            context = [*prefix, *solution[:index]]
            prompt = tokenizer.apply_chat_template(context, tools=tools or None, add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)["input_ids"]
            full = tokenizer.apply_chat_template([*context, message], tools=tools or None, tokenize=True,
                                                 return_dict=True)["input_ids"]
            if full[:len(prompt)] != prompt or len(full) == len(prompt):
                raise ValueError("the chat template does not render a turn as an extension of its prompt; a "
                                 "warm-start on it would teach tokens the policy never sees")
            rows.append({"input_ids": full, "completion_mask": [0] * len(prompt) + [1] * (len(full) - len(prompt))})
    return rows


def warm_start(config: WarmStartConfig) -> dict:
    """Fine-tune `config.model` on the rows and save it to `config.out`; returns a summary (also `warm_start.json`)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    prefix, tools = _read_prefix(config.prefix)
    solutions = _read_gold(config.gold, config.transcripts)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    rows = training_rows(tokenizer, solutions, prefix, tools)
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
    out = Path(config.out)
    with tempfile.TemporaryDirectory(prefix="warm-start-") as scratch:  # TRL's output_dir; nothing is kept there
        args = SFTConfig(
            output_dir=scratch, num_train_epochs=config.epochs, learning_rate=config.learning_rate,
            per_device_train_batch_size=1, gradient_accumulation_steps=config.batch_size,
            lr_scheduler_type="constant", completion_only_loss=True, max_length=None, save_strategy="no",
            report_to="none", logging_steps=1, seed=config.seed, use_cpu=not torch.cuda.is_available(), bf16=False,
            dataloader_num_workers=0,
            gradient_checkpointing=False,  # TRL turns it on; a small model has the memory and not the time for it
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer)
        result = trainer.train()
    trainer.save_model(str(out))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    summary = {
        "model": str(Path(config.model).resolve()), "transcripts": len(solutions), "rows": len(rows),
        "completion_tokens": sum(sum(r["completion_mask"]) for r in rows),
        "tokens": sum(len(r["input_ids"]) for r in rows), "optimizer_steps": trainer.state.global_step,
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "seconds": round(result.metrics.get("train_runtime", 0.0), 1),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
    }
    (out / "warm_start.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def add_warm_start_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the checkpoint to start from (a model directory)")
    parser.add_argument("out", help="where the warm-started checkpoint goes")
    parser.add_argument("--gold", required=True, help="train_gold.jsonl from interceptor make-tasks")
    parser.add_argument("--prefix", required=True, help="the agent's prefix: {\"messages\": [...], \"tools\": [...]}")
    parser.add_argument("--transcripts", type=int, default=WarmStartConfig.transcripts)
    parser.add_argument("--epochs", type=int, default=WarmStartConfig.epochs)
    parser.add_argument("--learning-rate", type=float, default=WarmStartConfig.learning_rate)
    parser.add_argument("--batch-size", type=int, default=WarmStartConfig.batch_size)
    parser.add_argument("--seed", type=int, default=WarmStartConfig.seed)
    parser.add_argument("--threads", type=int, default=None)


def run_warm_start_from_args(args: argparse.Namespace) -> int:
    try:
        config = WarmStartConfig(model=Path(args.model), out=Path(args.out), gold=Path(args.gold),
                                 prefix=Path(args.prefix), transcripts=args.transcripts, epochs=args.epochs,
                                 learning_rate=args.learning_rate, batch_size=args.batch_size, seed=args.seed,
                                 threads=args.threads)
        for path in (config.gold, config.prefix):
            if not path.is_file():
                raise ValueError(f"{path} is not a file")
        summary = warm_start(config)
    except (OSError, ValueError) as exc:
        print(f"interceptor warm-start: error: {exc}", file=sys.stderr)
        return 2
    print(f"warm-started {summary['model']} on {summary['rows']} turns of {summary['transcripts']} solutions "
          f"({summary['optimizer_steps']} steps, loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}, "
          f"{summary['seconds']:.0f}s): {args.out}")
    return 0
