"""The `interceptor` command. Subcommands import what they need when they run, so `interceptor serve` and
`interceptor inspect` never load torch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def _make_tiny_model(args: argparse.Namespace) -> int:
    """OUT is replaced when it is absent, empty or a model this command wrote; anything else is refused (exit 2).
    With --tool-calling, OUT is kept when it already holds that exact trained model."""
    from trainer.tiny_model import ModelDirError, TinyModelSpec, make_tiny_model

    try:
        if args.tool_calling:
            import dataclasses

            from trainer.local_model import LOCAL_TRAINING, make_local_model

            steps = LOCAL_TRAINING.steps if args.train_steps is None else args.train_steps
            make_local_model(args.out, training=dataclasses.replace(LOCAL_TRAINING, steps=steps))
            print(f"{args.out} holds a tiny Qwen3 model trained to call tools")
            return 0
        out = make_tiny_model(args.out, TinyModelSpec(real_vocab=args.real_vocab, seed=args.seed))
    except ModelDirError as exc:
        print(f"interceptor make-tiny-model: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a tiny Qwen3 model with random weights to {out}")
    return 0


def _engine(args: argparse.Namespace) -> int:
    from trainer.engine.main import run_engine_from_args

    return run_engine_from_args(args)


def _serve(args: argparse.Namespace) -> int:
    from .serve_main import run_serve_from_args

    return run_serve_from_args(args)


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import run_inspect_from_args

    return run_inspect_from_args(args)


def _run(args: argparse.Namespace) -> int:
    from trainer.run_main import run_from_args

    return run_from_args(args)


def _agents_install(args: argparse.Namespace) -> int:
    from agents.install import main as install_main

    return install_main([*args.names, *(["--force"] if args.force else [])])


def _train(args: argparse.Namespace) -> int:
    from trainer.train_main import run_train_from_args

    return run_train_from_args(args)


def _demo(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo_from_args

    return run_demo_from_args(args)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interceptor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        return sub

    tiny = command("make-tiny-model", _make_tiny_model, "write a tiny random Qwen3 model directory (offline)")
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
        help="with --tool-calling: training steps (default: the embedded default's); fewer make a weaker policy",
    )

    engine = command("engine", _engine, "serve a local policy (CPU or a CUDA GPU) with vLLM's /v1/completions API")
    engine.add_argument("--model", required=True, help="a transformers model directory")
    engine.add_argument("--host", default="127.0.0.1")
    engine.add_argument("--port", type=int, default=8000)
    engine.add_argument("--served-model-name", default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument(
        "--logprobs-mode", choices=("raw_logprobs", "processed_logprobs"), default="raw_logprobs"
    )
    engine.add_argument("--max-batch-size", type=int, default=8)
    engine.add_argument("--threads", type=int, default=1, help="torch threads for generation")
    engine.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (vLLM's --device)")
    engine.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the weights' dtype (vLLM's --dtype)")

    serve = command("serve", _serve, "run the interception server in front of a policy server")
    serve.add_argument("--upstream", required=True, action="append",
                       help="base URL of vLLM or the local engine (or an OpenAI API); repeat it for replicas of the "
                            "policy, each rollout pinned to one")
    serve.add_argument("--model", help="the model directory (tokenizer and chat template); interception_gate")
    serve.add_argument("--mode", choices=("interception_gate", "black_box"), default="interception_gate")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument(
        "--record",
        help="JSON Lines file for finished rollouts. With --workers N > 1 each worker writes its own file beside it "
        "(rollouts.jsonl -> rollouts.w0.jsonl, rollouts.w1.jsonl, ...), with its own journal and crash recovery: "
        "restart with the same N",
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="server processes, one core each (default 1). With N > 1, --host:--port is a front holding the admin "
        "API and /health; rollouts are shared among the workers, and each rollout's base URL names its worker's port",
    )
    serve.add_argument(
        "--admin-token-file", help="write the admin token here (mode 0600) when INTERCEPTOR_ADMIN_TOKEN is unset"
    )

    inspect = command("inspect", _inspect, "summarise a trajectory file, or show one rollout's turns")
    inspect.add_argument("file")
    inspect.add_argument("--rollout", help="show this rollout's samples and turns")
    inspect.add_argument("--model", help="a model directory whose tokenizer decodes the spans")

    from agents.run_args import add_run_arguments

    run = command("run", _run, "run an agent (pi, opencode, or a command) on a task file, graded on the host")
    add_run_arguments(run)

    install = command("agents", _agents_install, "install a pinned agent from npm: interceptor agents install NAME")
    install.add_argument("action", choices=("install",))
    install.add_argument("names", nargs="+", choices=("pi", "opencode"), metavar="NAME")
    install.add_argument("--force", action="store_true")

    train = command("train", _train, "GRPO on a real agent: TRL AsyncGRPOTrainer fed by intercepted rollouts")
    train.add_argument("--config", required=True, help="a TOML file (see trainer/train_main.py)")

    demo = command("demo", _demo, "build the tiny model, start the local engine and the server, run a rollout")
    demo.add_argument("--workdir", default="runs/demo")
    demo.add_argument("--turns", type=int, default=3, help="chat calls the demo agent makes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
