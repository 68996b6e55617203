"""Per-turn cost of the interceptor's own work (match + render + assemble) along a long tool loop.

At turns 1, 2, 64 and 256 of a tool loop it times `Trajectory.plan` + `commit` (what the server does per turn
besides HTTP and the upstream call) and, in the same run, a full re-render + tokenization of the whole history
(what a proxy that re-renders every turn pays). Turn 1 forks (a full render); from turn 2 on every turn extends.
Goal (DESIGN.md): turn 256 costs no more than 1.1x turn 2.

Each checkpoint has a trajectory of its own, built up to it, and the timed turns of all checkpoints are
interleaved (round after round, in a shuffled order), so a machine that speeds up or slows down during the run
moves all of them alike: timed one checkpoint after another, turn 2's median alone moved by 0.023-0.035 ms between
runs, more than what the history adds. The full re-renders run in a block of their own: a 50 ms render between
two timed turns evicts their caches and made turn 256 look 1.5x turn 1.

    python bench/bench_turn_cost.py [--model DIR] [--turns 256] [--repeats 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_server import model_or_tiny  # noqa: E402
from interceptor.gate.trajectory import Trajectory  # noqa: E402
from interceptor.store.records import Generation  # noqa: E402
from interceptor.tokens.rendering import Renderer, RendererConfig  # noqa: E402

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


class _Loop:
    """A tool loop on a trajectory of its own, advanced a turn at a time."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.trajectory = Trajectory(renderer, stop_ids=frozenset({renderer.end_of_turn_id}))
        self.messages = [{"role": "system", "content": "You are a coding agent."},
                         {"role": "user", "content": "Fix the bug."}]
        self.turn = 0
        self.request, self.carried = list(self.messages), (None, 0)
        self._next()

    def _next(self) -> None:
        """What the model answers at the next turn."""
        n = self.turn + 1
        call = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat src/module_%d.py"}}\n</tool_call>' % n
        sampled = self.renderer.encode(call) + [self.renderer.end_of_turn_id]
        self.generation = Generation(token_ids=sampled, logprobs=[-0.5] * len(sampled), finish_reason="stop",
                                     model="m", seconds=0.0)
        self.returned = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": f"call_{n}", "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat src/module_{n}.py"})}}],
        }

    def one_turn(self) -> None:
        """Plan and commit the next turn, as the server does around the upstream call."""
        plan = self.trajectory.plan(self.request, TOOLS, carried=self.carried)
        self.trajectory.commit(plan, self.generation, returned=self.returned, finish_reason="tool_calls",
                               malformed=False, policy_version=0, spans_sync=False)

    def timed_turn(self) -> float:
        """The next turn's plan + commit, timed, then undone."""
        saved = _snapshot(self.trajectory)
        started = time.perf_counter()
        self.one_turn()
        elapsed = time.perf_counter() - started
        _restore(self.trajectory, saved)
        return elapsed

    def advance(self) -> None:
        """Take the next turn for real, and the tool's result."""
        self.one_turn()
        self.turn += 1
        self.messages.append(self.returned)
        self.messages.append({"role": "tool", "tool_call_id": f"call_{self.turn}",
                              "content": f"def function_{self.turn}(x):\n    return x * {self.turn}  # {'padding ' * 8}\n"})
        # the next request, as the server's parse makes it: the last one's messages, the same objects, then the new
        self.request, self.carried = [*self.request, *self.messages[-2:]], (self.request, len(self.request))
        self._next()


def build_loop(renderer: Renderer, checkpoints: set[int], repeats: int, seed: int = 0) -> dict[int, dict[str, float]]:
    loops: dict[int, _Loop] = {}
    for turn in sorted(checkpoints):
        loop = _Loop(renderer)
        while loop.turn + 1 < turn:
            loop.advance()
        loops[turn] = loop
    order = random.Random(seed)
    timings: dict[int, list[float]] = {turn: [] for turn in loops}
    for _ in range(repeats):
        turns = list(loops)
        order.shuffle(turns)
        for turn in turns:
            timings[turn].append(loops[turn].timed_turn())
    results: dict[int, dict[str, float]] = {}
    for turn, loop in loops.items():  # in a block of its own: a 50 ms render between timed turns evicts their caches
        full = []
        for _ in range(max(repeats // 10, 5)):
            started = time.perf_counter()
            renderer.render_full(loop.messages, TOOLS)
            full.append(time.perf_counter() - started)
        results[turn] = {
            "interceptor_ms_p50": statistics.median(timings[turn]) * 1e3,
            "full_rerender_ms_p50": statistics.median(full) * 1e3,
            "history_tokens": len(renderer.render_full(loop.messages, TOOLS)),
        }
    return results


def _snapshot(trajectory: Trajectory):
    branch = trajectory._branches[-1] if trajectory._branches else None  # bench-only peek, to undo a timed turn
    if branch is None:
        return None
    return (branch, len(branch.parts), branch.length, len(branch.sampled_logprobs), branch.asked, branch.answer,
            list(branch.turns), branch.open_turn)


def _restore(trajectory: Trajectory, saved) -> None:
    if saved is None:
        trajectory._branches.clear()
        return
    branch, parts, length, sampled, asked, answer, turns, open_turn = saved
    del branch.sampled_logprobs[sampled:]
    del branch.parts[parts:]
    branch.length = length
    branch.asked, branch.answer, branch.turns, branch.open_turn = asked, answer, turns, open_turn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: build the tiny model with the real Qwen vocab)")
    parser.add_argument("--turns", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    model = model_or_tiny(args.model)
    renderer = Renderer(RendererConfig(model_dir=Path(model)))
    checkpoints = {1, 2, 64, args.turns}
    results = build_loop(renderer, checkpoints, args.repeats)
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
