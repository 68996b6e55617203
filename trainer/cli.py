"""The subcommands the trainer package adds to the `interceptor` command line: make-tiny-model, make-model, engine,
run, train, make-tasks, evaluate, warm-start, replay and demo.

Registered through the `interceptor.commands` entry point (pyproject.toml). Each handler imports torch-backed modules
only when it runs, so registering these commands keeps `interceptor serve` and `interceptor inspect` light.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from agents.run_args import add_run_arguments
from agents.sandbox.backends import CHOICES as SANDBOX_CHOICES
from agents.specs.registry import AGENTS

if TYPE_CHECKING:
    from interceptor.cli import CommandRegistry

__all__ = ["register"]


def _make_tiny_model(args: argparse.Namespace) -> int:
    """OUT is replaced when it is absent, empty or a model this command wrote; anything else is refused (exit 2).
    With --tool-calling, OUT is kept when it already holds that exact trained model."""
    from trainer.models.tiny_model import ModelDirError, TinyModelSpec, make_tiny_model

    try:
        if args.tool_calling:
            import dataclasses

            from trainer.models.local_model import LOCAL_TRAINING, make_local_model

            training = LOCAL_TRAINING
            if args.train_steps is not None:  # a weaker policy, as trained: no corrective steps after the check
                training = dataclasses.replace(LOCAL_TRAINING, steps=args.train_steps, check_rounds=0)
            make_local_model(args.out, training=training)
            print(f"{args.out} holds a tiny Qwen3 model trained to call tools")
            return 0
        out = make_tiny_model(args.out, TinyModelSpec(real_vocab=args.real_vocab, seed=args.seed))
    except ModelDirError as exc:
        print(f"interceptor make-tiny-model: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a tiny Qwen3 model with random weights to {out}")
    return 0


def _make_model(args: argparse.Namespace) -> int:
    """A real pretrained model a package ships (`trainer.models.packaged_model`), written to OUT as a checkpoint."""
    from trainer.models.packaged_model import PackagedModelMissing, import_packaged_model
    from trainer.models.tiny_model import ModelDirError

    try:
        out = import_packaged_model(args.name, args.out, dtype=args.dtype, untie=args.untie_embeddings)
    except (ModelDirError, PackagedModelMissing) as exc:
        print(f"interceptor make-model: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.name} ({args.dtype}) to {out}")
    return 0


def _engine(args: argparse.Namespace) -> int:
    from trainer.engine.main import run_engine_from_args

    return run_engine_from_args(args)


def _run(args: argparse.Namespace) -> int:
    from trainer.run_main import run_from_args

    return run_from_args(args)


def _train(args: argparse.Namespace) -> int:
    from trainer.train_main import run_train_from_args

    return run_train_from_args(args)


def _demo(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo_from_args

    return run_demo_from_args(args)


def _evaluate(args: argparse.Namespace) -> int:
    from trainer.learning.evaluate import run_evaluate_from_args

    return run_evaluate_from_args(args)


def _warm_start(args: argparse.Namespace) -> int:
    from trainer.learning.warm_start import run_warm_start_from_args

    return run_warm_start_from_args(args)


def _make_tasks(args: argparse.Namespace) -> int:
    from trainer.learning.families import write_family

    try:
        described = write_family(args.family, args.out, seed=args.seed, train=args.train, held_out=args.held_out,
                                 shots=args.shots)
    except (OSError, ValueError) as exc:
        print(f"interceptor make-tasks: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {described['train']} training and {described['held_out']} held-out {args.family} tasks "
          f"(seed {args.seed}) and {described['shots']} worked examples to {args.out}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from trainer.replay import run_replay_from_args

    return run_replay_from_args(args)


def register(commands: CommandRegistry) -> None:
    real = commands.add("make-model", _make_model,
                        "write a real pretrained model that a package ships as a checkpoint (offline): smollm2")
    real.add_argument("name", choices=("smollm2",))
    real.add_argument("out")
    real.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    real.add_argument("--untie-embeddings", action="store_true",
                      help="give the output head its own copy of the embeddings (same logits): what training "
                           "against vLLM by weight reload needs")
    tiny = commands.add("make-tiny-model", _make_tiny_model, "write a tiny random Qwen3 model directory (offline)")
    tiny.add_argument("out")
    tiny.add_argument("--real-vocab", action="store_true", help="use the real Qwen BPE vocabulary (151k tokens)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--tool-calling",
        action="store_true",
        help="the embedded default: real vocabulary, 32k context, trained offline (~1-2 min) to answer with a tool call",
    )
    tiny.add_argument(
        "--train-steps",
        type=int,
        default=None,
        help="with --tool-calling: training steps (default: the embedded default's, then up to "
        "check_rounds corrective ones); given, exactly this many: fewer make a weaker policy",
    )

    engine = commands.add("engine", _engine, "serve a local policy (CPU or a CUDA GPU) with vLLM's /v1/completions API")
    engine.add_argument("--model", required=True, help="a transformers model directory")
    engine.add_argument("--host", default="127.0.0.1")
    engine.add_argument("--port", type=int, default=8000)
    engine.add_argument("--served-model-name", default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument(
        "--logprobs-mode", choices=("raw_logprobs", "processed_logprobs"), default="raw_logprobs"
    )
    engine.add_argument("--max-batch-size", type=int, default=8)
    engine.add_argument("--prefix-cache-mib", type=int, default=512,
                        help="keys and values of recent prompts kept for prompts that start with them; 0: off")
    engine.add_argument("--threads", type=int, default=1, help="torch threads for generation")
    engine.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (vLLM's --device)")
    engine.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the weights' dtype (vLLM's --dtype)")

    run = commands.add("run", _run, f"run an agent ({', '.join(AGENTS)}) on a task file, graded on the host")
    add_run_arguments(run)

    train = commands.add("train", _train, "GRPO on a real agent: TRL AsyncGRPOTrainer fed by intercepted rollouts")
    train.add_argument("--config", required=True, help="a TOML file (see trainer/train_main.py)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a key of the config file (the value is read as TOML); repeatable")

    from trainer.learning.families import FAMILIES

    tasks = commands.add("make-tasks", _make_tasks, "generate a task family's training and held-out splits (no shared "
                                                    "instance) and worked examples, from a seed")
    tasks.add_argument("family", choices=sorted(FAMILIES))
    tasks.add_argument("out")
    tasks.add_argument("--seed", type=int, default=0)
    tasks.add_argument("--train", type=int, default=200, help="training tasks")
    tasks.add_argument("--held-out", type=int, default=100, help="held-out tasks")
    tasks.add_argument("--shots", type=int, default=3, help="worked examples for the few-shot agent")

    from trainer.learning.evaluate import add_evaluate_arguments

    evaluate = commands.add("evaluate", _evaluate, "a checkpoint's held-out success rate with its Wilson interval, "
                                                   "through the training config's agent; writes JSON and a plot")
    add_evaluate_arguments(evaluate)

    from trainer.learning.warm_start import add_warm_start_arguments

    warm = commands.add("warm-start", _warm_start, "a short supervised fine-tune on a family's training solutions "
                                                   "(TRL SFT, loss on the agent's turns), before GRPO")
    add_warm_start_arguments(warm)

    replay = commands.add("replay", _replay, "run an agent again against a recorded rollout, with no model: did it "
                                             "match turn for turn, and where did it diverge")
    replay.add_argument("records", help="a record file (rollouts.jsonl)")
    replay.add_argument("--rollout", required=True, help="the rollout id to replay")
    replay.add_argument("--tasks", required=True, help="the task file the rollout's task comes from")
    replay.add_argument("--agent", choices=tuple(AGENTS), default=None,
                        help="default: the agent the record names")
    replay.add_argument("--command", default=None, help="the command agent's command line")
    replay.add_argument("--max-tokens", type=int, default=None)
    replay.add_argument("--model", default=None, help="the model directory (tokenizer and chat template); default: "
                                                      "the one setup.json beside RECORDS names")
    replay.add_argument("--sandbox", choices=SANDBOX_CHOICES, default="auto", help="as `run --sandbox`")

    demo = commands.add("demo", _demo, "build the tiny model, start the local engine and the server, run a rollout")
    demo.add_argument("--workdir", default="runs/demo")
    demo.add_argument("--turns", type=int, default=3, help="chat calls the demo agent makes")
