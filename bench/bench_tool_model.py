"""Tool-calling tiny model: training time, and how often it makes the right call, greedy and at temperature 1.

    python bench/bench_tool_model.py                      # real vocabulary, agents' captured prompts if present
    python bench/bench_tool_model.py --small-vocab --steps 40 --json
    python bench/bench_tool_model.py --model runs/model     # evaluate a built embedded default, no training

Builds a `tool_model_spec()` model in a temp dir, trains it as the embedded default is trained (`LOCAL_TRAINING`, with
`--steps` and `--seed`), then generates (transformers
`generate`, one thread, as the local engine does) on prompts it never saw: held-out task phrasings and numbers,
distractor numbers, a long system prompt, each shell tool shape, and each captured agent's real request (the messages
around its task and its tools: Pi, OpenCode, Claude Code, Codex). A call is right when `parse_output` finds exactly
one call of the offered shell tool (`bash`/`Bash` with `{"command": "answer N"}`, `exec_command` with `{"cmd": ...}`)
and nothing else before `<|im_end|>`; "formed" counts well-formed calls of that tool with `answer <digits>`, right
number or not. After the tool response the model must answer `Done.` with no call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interceptor.wire.parsing import parse_output  # noqa: E402
from trainer.models.agent_contexts import SHELL_TOOLS, Context, load_agent_request  # noqa: E402
from trainer.models.local_model import LOCAL_TRAINING  # noqa: E402
from trainer.models.tiny_model import make_tiny_model  # noqa: E402
from trainer.models.tool_episodes import shell_tool  # noqa: E402
from trainer.models.tool_model import BASH_TOOL, DONE_TEXT, ToolTrainingSpec, tool_model_spec, train_tool_calling  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENT_REQUESTS = {name: ROOT / "trainer" / "models" / "agent_requests" / f"{name}_first_request.json"
                  for name in ("pi", "opencode", "claude", "codex")}
HELD_OUT_TASKS = (
    "Please submit the answer {n} when ready.",
    "Submit the answer {n}, nothing else.",
    "I computed it already: submit the answer {n} via bash.",
    "There are 17 files here. Submit the answer {n}.",
    "You have 5 minutes. Please submit the answer {n}.",
)
READ_TOOL = {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
LONG_SYSTEM = " ".join(
    random.Random(1).choice("you are an agent read the files and run 12 commands carefully then report".split())
    for _ in range(1500)
)


def generate(model, tokenizer, prompts: list[str], *, temperature: float | None, max_new_tokens: int = 40) -> list[str]:
    import torch

    tokenizer.padding_side = "left"
    texts = []
    for i in range(0, len(prompts), 8):
        batch = tokenizer(prompts[i:i + 8], return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {"do_sample": False} if temperature is None else {
            "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 **sampling)
        for row in out[:, batch["input_ids"].shape[1]:]:
            texts.append(tokenizer.decode(row, skip_special_tokens=False).replace(tokenizer.pad_token, ""))
    return texts


def is_answer_call(text: str, number: int, shell: tuple[str, str] = ("bash", "command")) -> bool:
    if not text.endswith("<|im_end|>") or text.count("<|im_end|>") != 1:
        return False
    parsed = parse_output(text.removesuffix("<|im_end|>"))
    name, argument = shell
    return (not parsed.malformed and parsed.content is None and len(parsed.calls) == 1
            and parsed.calls[0].name == name
            and json.loads(parsed.calls[0].arguments) == {argument: f"answer {number}"})


def is_shell_call(text: str, shell: tuple[str, str]) -> bool:
    """Exactly one call of the offered shell tool with its one argument, `answer <digits>` (any number), then the
    end of the turn: well-formed, right or not."""
    if not text.endswith("<|im_end|>") or text.count("<|im_end|>") != 1:
        return False
    parsed = parse_output(text.removesuffix("<|im_end|>"))
    if parsed.malformed or parsed.content is not None or len(parsed.calls) != 1 or parsed.calls[0].name != shell[0]:
        return False
    arguments = json.loads(parsed.calls[0].arguments)
    return list(arguments) == [shell[1]] and re.fullmatch(r"answer \d+", str(arguments[shell[1]])) is not None


def first_turn(tokenizer, context: Context, task: str) -> str:
    return tokenizer.apply_chat_template(context.messages({"role": "user", "content": task}),
                                         tools=list(context.tools), tokenize=False, add_generation_prompt=True)


def second_turn(tokenizer, context: Context, task: str, number: int, output: str) -> str:
    name, argument = context.shell
    call = {"id": "c1", "type": "function",
            "function": {"name": name, "arguments": json.dumps({argument: f"answer {number}"})}}
    messages = context.messages({"role": "user", "content": task}) + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    return tokenizer.apply_chat_template(messages, tools=list(context.tools), tokenize=False,
                                         add_generation_prompt=True)


def _synthetic(system: str, tools: list[dict], shell: tuple[str, str]) -> Context:
    return Context(before=({"role": "system", "content": system},), tools=tuple(tools), shell=shell)


def evaluate(model_dir: Path, *, samples: int, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(seed)
    numbers = [rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)
               for digits in (rng.choice((1, 2, 3, 4)) for _ in range(samples))]
    tasks = [HELD_OUT_TASKS[i % len(HELD_OUT_TASKS)].format(n=n) for i, n in enumerate(numbers)]
    contexts = {f"short system, {name} + read":
                _synthetic("You are a coding agent.", [READ_TOOL, shell_tool(name, arg)], (name, arg))
                for name, arg in SHELL_TOOLS}
    contexts["1500-word system prompt"] = _synthetic(LONG_SYSTEM, [BASH_TOOL], ("bash", "command"))
    for name, path in AGENT_REQUESTS.items():
        if path.is_file():
            contexts[name] = load_agent_request(path)
    results = {}
    for name, context in contexts.items():
        count = samples if len(context.tools) < 4 else max(4, samples // 4)  # agents' prompts are slow to run
        prompts = [first_turn(tokenizer, context, task) for task in tasks[:count]]
        greedy = generate(model, tokenizer, prompts, temperature=None)
        sampled = generate(model, tokenizer, prompts, temperature=1.0)
        after = generate(model, tokenizer, [
            second_turn(tokenizer, context, task, n, rng.choice(("ok", "", "Answer recorded.", "error: 1")))
            for task, n in zip(tasks[:count], numbers)], temperature=None, max_new_tokens=12)
        right = [is_answer_call(text, n, context.shell) for text, n in zip(greedy, numbers)]
        results[name] = {
            "prompts": count,
            "greedy": sum(right) / count,
            "well_formed": sum(is_shell_call(text, context.shell) for text in greedy) / count,
            "temperature_1": sum(is_answer_call(text, n, context.shell) for text, n in zip(sampled, numbers)) / count,
            "done_after_tool": sum(text == DONE_TEXT + "<|im_end|>" for text in after) / count,
            "greedy_failures": [text for text, ok in zip(greedy, right) if not ok][:3],
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-vocab", action="store_true")
    parser.add_argument("--steps", type=int, default=LOCAL_TRAINING.steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=LOCAL_TRAINING.threads, help="torch threads for training "
                        "(a build is bitwise the same for a seed and a thread count)")
    parser.add_argument("--no-agents", action="store_true", help="do not train on the captured agent requests (by "
                        "default the embedded default's training, trainer.models.local_model.LOCAL_TRAINING, is run)")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", type=Path, help="evaluate this trained model (e.g. the embedded default built by "
                        "`interceptor make-tiny-model DIR --tool-calling`) instead of training one")
    args = parser.parse_args()
    agents = () if args.no_agents else LOCAL_TRAINING.agent_requests
    if args.model is not None:
        record = json.loads((args.model / "interceptor_tool_training.json").read_text())
        results = evaluate(args.model, samples=args.samples, seed=args.seed + 1)
        summary = {"vocab": "of the model", "agents": record["spec"]["agent_requests"],
                   "training": {**record["report"], "wall_seconds": float("nan"),
                                "threads": record["spec"].get("threads")}, "accuracy": results}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = make_tiny_model(Path(tmp) / "tool", tool_model_spec(real_vocab=not args.small_vocab))
            start = time.perf_counter()
            spec = (ToolTrainingSpec(steps=args.steps, seed=args.seed, threads=args.threads) if args.no_agents
                    else dataclasses.replace(LOCAL_TRAINING, steps=args.steps, seed=args.seed, threads=args.threads))
            report = train_tool_calling(model_dir, spec)
            wall = time.perf_counter() - start
            results = evaluate(model_dir, samples=args.samples, seed=args.seed + 1)
        summary = {"vocab": "small" if args.small_vocab else "real", "agents": [p.stem for p in agents],
                   "training": {**report.__dict__, "wall_seconds": wall, "threads": spec.threads},
                   "accuracy": results}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    t = summary["training"]
    print(f"{summary['vocab']} vocabulary, {t['steps']} steps, {t['episodes']} episodes, {t['tokens']} tokens: "
          f"{t['seconds']:.1f} s training loop, {t['wall_seconds']:.1f} s with loading and saving; "
          f"{t['threads']} thread(s); loss {t['final_loss']:.3f}; {t.get('corrective_steps', 0)} corrective "
          f"step(s), agent margins {t.get('agent_margins', {})}")
    print(f"{'context':>28} {'prompts':>7} {'greedy':>7} {'formed':>7} {'temp 1':>7} {'Done.':>6}")
    for name, r in results.items():
        print(f"{name:>28} {r['prompts']:>7} {r['greedy']:>7.0%} {r['well_formed']:>7.0%} {r['temperature_1']:>7.0%} "
              f"{r['done_after_tool']:>6.0%}")
        for text in r["greedy_failures"]:
            print(f"{'':>30}wrong: {text[:90]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
