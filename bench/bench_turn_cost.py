"""Per-turn cost of the interceptor's own work (match + render + assemble) along a long tool loop.

At turns 1, 2, 64 and 256 of a tool loop it times `Trajectory.plan` + `commit` (what the server does per turn
besides HTTP and the upstream call) and, in the same run, a full re-render + tokenization of the whole history
(what a proxy that re-renders every turn pays). Turn 1 forks (a full render); from turn 2 on every turn extends.
Goal (DESIGN.md): turn 256 costs no more than 1.1x turn 2. The two kinds of timing run in separate blocks: a
50 ms render between two timed turns evicts their caches and made turn 256 look 1.5x turn 1.

    python bench/bench_turn_cost.py [--model DIR] [--turns 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_server import model_or_tiny  # noqa: E402
from interceptor.rendering import Renderer, RendererConfig  # noqa: E402
from interceptor.records import Generation  # noqa: E402
from interceptor.trajectory import Trajectory  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool of a coding agent",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "cmd": {"type": "string"}}},
        },
    }
    for name in ("bash", "read", "write", "edit", "grep", "ls")
]


def build_loop(renderer: Renderer, turns: int, checkpoints: set[int], repeats: int) -> dict[int, dict[str, float]]:
    trajectory = Trajectory(renderer, stop_ids=frozenset({renderer.end_of_turn_id}))
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]
    call = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat src/module_%d.py"}}\n</tool_call>'
    results: dict[int, dict[str, float]] = {}
    for turn in range(1, turns + 1):
        sampled = renderer.encode(call % turn) + [renderer.end_of_turn_id]
        generation = Generation(token_ids=sampled, logprobs=[-0.5] * len(sampled), finish_reason="stop",
                                model="m", seconds=0.0)
        returned = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"call_{turn}", "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat src/module_{turn}.py"})}}],
        }

        def one_turn() -> None:
            plan = trajectory.plan(messages, TOOLS)
            trajectory.commit(plan, generation, returned=returned, finish_reason="tool_calls", malformed=False,
                              policy_version=0)

        if turn in checkpoints:
            timings, full = [], []
            for _ in range(repeats):  # time plan+commit on a throwaway copy of the state, then do it for real
                saved = _snapshot(trajectory)
                started = time.perf_counter()
                one_turn()
                timings.append(time.perf_counter() - started)
                _restore(trajectory, saved)
            for _ in range(repeats):  # in a block of its own: a 50 ms render between timed turns evicts their caches
                started = time.perf_counter()
                renderer.render_full(messages, TOOLS)
                full.append(time.perf_counter() - started)
            results[turn] = {
                "interceptor_ms_p50": statistics.median(timings) * 1e3,
                "full_rerender_ms_p50": statistics.median(full) * 1e3,
                "history_tokens": len(renderer.render_full(messages, TOOLS)),
            }
        one_turn()
        messages.append(returned)
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                         "content": f"def function_{turn}(x):\n    return x * {turn}  # {'padding ' * 8}\n"})
    return results


def _snapshot(trajectory: Trajectory):
    branch = trajectory._branches[-1] if trajectory._branches else None  # bench-only peek, to undo a timed turn
    if branch is None:
        return None
    return (branch, branch.ids_json, branch.length, len(branch.sampled_logprobs), list(branch.turn_json_ends),
            list(branch.messages), list(branch.turns), branch.open_turn)


def _restore(trajectory: Trajectory, saved) -> None:
    if saved is None:
        trajectory._branches.clear()
        return
    branch, ids_json, length, sampled, json_ends, messages, turns, open_turn = saved
    del branch.sampled_logprobs[sampled:]
    branch.ids_json, branch.length, branch.turn_json_ends = ids_json, length, json_ends
    branch.messages, branch.turns, branch.open_turn = messages, turns, open_turn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: build the tiny model with the real Qwen vocab)")
    parser.add_argument("--turns", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    model = model_or_tiny(args.model)
    renderer = Renderer(RendererConfig(model_dir=Path(model)))
    checkpoints = {1, 2, 64, args.turns}
    results = build_loop(renderer, args.turns, checkpoints, args.repeats)
    base = results[2]["interceptor_ms_p50"]  # turn 1 forks (a full render); every later turn extends
    print(f"{'turn':>5} {'history tokens':>15} {'interceptor p50 ms':>19} {'vs turn 2':>10} {'full re-render p50 ms':>22}")
    for turn in sorted(results):
        r = results[turn]
        print(f"{turn:>5} {r['history_tokens']:>15} {r['interceptor_ms_p50']:>19.3f} "
              f"{r['interceptor_ms_p50'] / base:>9.2f}x {r['full_rerender_ms_p50']:>22.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
