"""Task families: tasks generated from a seed, in a training split and a held-out split that share no instance,
with worked examples (shots) for a few-shot agent drawn from neither.

    interceptor make-tasks lookup runs/lookup --seed 1 --train 200 --held-out 100

writes `train.jsonl` and `held_out.jsonl` (task files, `agents.tasks`), `shots.json` (chat messages for
`examples/agents/simple_agent.py --shots`), `train_gold.jsonl` (a worked solution per training task, for
`interceptor warm-start`; none for a held-out one) and `family.json` (what was generated, from what seed). Every task is
graded on the host by its `answer` grader; the expected value is in the task file, never in the workspace.

- `submit`: the instruction names the number and the command ("Submit the number 4821 by running: answer 4821");
  what is measured is a well-formed tool call carrying the right value.
- `lookup`: the number is in a file of the workspace (`note.txt`) and only there; the agent must read it with a
  tool, then submit it: the answer is not in the instruction.
- `add`: "What is 37 + 48?"; the agent must work the sum out (the shots do it with the shell's arithmetic).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FAMILIES", "Family", "Instance", "write_family"]

_LIMITS = {"wall_s": 180, "idle_s": 90}


@dataclass(frozen=True)
class Instance:
    key: tuple[int, ...]  # what makes two instances the same; no key is in both splits or in the shots
    instruction: str
    expected: str
    files: dict[str, str]


def _call(call_id: str, command: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


def _result(call_id: str, output: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _submit(rng: random.Random) -> Instance:
    n = rng.randint(100, 9999)
    return Instance((n,), f"Submit the number {n} by running the shell command: answer {n}", str(n), {})


def _submit_shot(instance: Instance, i: int) -> list[dict]:
    return [{"role": "user", "content": instance.instruction}, _call(f"call_{i}_0", f"answer {instance.expected}"),
            _result(f"call_{i}_0", "answer recorded"), {"role": "assistant", "content": "Done."}]


def _lookup(rng: random.Random) -> Instance:
    n = rng.randint(100, 9999)
    return Instance((n,), "The file note.txt holds a code. Read it, then submit the code by running the shell "
                    "command: answer <code>", str(n), {"note.txt": f"The code is {n}.\n"})


def _lookup_shot(instance: Instance, i: int) -> list[dict]:
    return [{"role": "user", "content": instance.instruction}, _call(f"call_{i}_0", "cat note.txt"),
            _result(f"call_{i}_0", instance.files["note.txt"].strip()),
            _call(f"call_{i}_1", f"answer {instance.expected}"), _result(f"call_{i}_1", "answer recorded"),
            {"role": "assistant", "content": "Done."}]


def _add(rng: random.Random) -> Instance:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return Instance((a, b), f"What is {a} + {b}? Submit the result by running the shell command: answer <result>",
                    str(a + b), {})


def _add_shot(instance: Instance, i: int) -> list[dict]:
    a, b = instance.key
    return [{"role": "user", "content": instance.instruction}, _call(f"call_{i}_0", f"echo $(({a} + {b}))"),
            _result(f"call_{i}_0", str(a + b)), _call(f"call_{i}_1", f"answer {a + b}"),
            _result(f"call_{i}_1", "answer recorded"), {"role": "assistant", "content": "Done."}]


@dataclass(frozen=True)
class Family:
    name: str
    draw: Callable[[random.Random], Instance]
    shot: Callable[[Instance, int], list[dict]]
    capacity: int  # how many distinct instances it has
    doc: str


FAMILIES = {f.name: f for f in (
    Family("submit", _submit, _submit_shot, 9900, "the number and the command are in the instruction"),
    Family("lookup", _lookup, _lookup_shot, 9900, "the number is only in the workspace's note.txt"),
    Family("add", _add, _add_shot, 90 * 90, "the number is the sum of two in the instruction"),
)}


def _task(family: str, split: str, index: int, instance: Instance) -> dict:
    task = {"id": f"{family}-{split}-{index:04d}", "instruction": instance.instruction,
            "grader": {"kind": "answer", "expected": instance.expected, "match": "numeric"}, "limits": _LIMITS}
    if instance.files:
        task["files"] = instance.files
    return task


def write_family(name: str, out: Path | str, *, seed: int, train: int, held_out: int, shots: int = 3) -> dict:
    """Write the family's splits, shots and description under `out`; returns the description."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {sorted(FAMILIES)}")
    family = FAMILIES[name]
    if train < 1 or held_out < 1 or shots < 0:
        raise ValueError("train and held_out must be at least 1, shots at least 0")
    if train + held_out + shots > family.capacity // 2:
        raise ValueError(f"{name} has {family.capacity} instances: ask for at most {family.capacity // 2} in all")
    rng = random.Random(f"{name}:{seed}")
    drawn: dict[tuple[int, ...], Instance] = {}
    while len(drawn) < shots + train + held_out:  # distinct keys, so no instance is in two places
        instance = family.draw(rng)
        drawn.setdefault(instance.key, instance)
    instances = list(drawn.values())
    shot_set, train_set, held_set = instances[:shots], instances[shots:shots + train], instances[shots + train:]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, chosen in (("train", train_set), ("held_out", held_set)):
        lines = [json.dumps(_task(name, split, i, inst)) for i, inst in enumerate(chosen)]
        (out / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    gold = [json.dumps({"task_id": f"{name}-train-{i:04d}", "messages": family.shot(inst, shots + i)})
            for i, inst in enumerate(train_set)]
    (out / "train_gold.jsonl").write_text("\n".join(gold) + "\n", encoding="utf-8")
    messages = [m for i, inst in enumerate(shot_set) for m in family.shot(inst, i)]
    (out / "shots.json").write_text(json.dumps(messages, indent=1) + "\n", encoding="utf-8")
    description = {"family": name, "doc": family.doc, "seed": seed, "train": train, "held_out": held_out,
                   "shots": shots}
    (out / "family.json").write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    return description
