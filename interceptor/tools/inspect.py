"""`interceptor inspect FILE [--rollout ID] [--model DIR]`: read a trajectory file back and summarise it.

Without `--rollout`: counts of rollouts by status, samples and their chains by kind, tokens (sampled and not),
forks, auxiliary samples, failures by cause, and the mean reward of the graded rollouts. With `--rollout`: that
rollout's samples (each chain's kind and where it hangs) and turns, each span marked `[prompt]` (mask 0),
`[sampled]` (mask 1) or `[context]` (sampled, trained in an earlier sample), decoded when `--model` gives the
tokenizer.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Iterable

from interceptor.store.recorder import read_records
from interceptor.store.records import RolloutRecord, SampleRecord

__all__ = ["run_inspect_from_args", "summarise"]


def summarise(records: Iterable[RolloutRecord]) -> dict:
    status: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    totals = Counter()
    kinds: Counter[str] = Counter()
    rewards = []
    for record in records:
        status[record.status] += 1
        if record.failure is not None:
            causes[record.failure.cause] += 1
        totals["samples"] += len(record.samples)
        totals["forks"] += record.forks
        totals["auxiliary"] += sum(s.auxiliary for s in record.samples)
        kinds.update(s.kind for s in record.samples)
        totals["turns"] += sum(len(s.turns) for s in record.samples)
        for sample in record.samples:
            sampled = sum(sample.completion_mask)
            totals["sampled_tokens"] += sampled
            totals["prompt_tokens"] += len(sample.input_ids) - sampled
        if record.reward is not None:
            rewards.append(record.reward)
    return {
        "rollouts": sum(status.values()),
        "by_status": dict(status),
        "failures_by_cause": dict(causes),
        **totals,
        "chains_by_kind": dict(kinds),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
    }


def _spans(sample: SampleRecord) -> Iterable[tuple[str, int, int]]:
    start = 0
    for turn in sample.turns:
        if turn.completion_start > start:
            yield "prompt", start, turn.completion_start
        trained = sample.completion_mask[turn.completion_start] if turn.completion_end > turn.completion_start else 1
        yield "sampled" if trained else "context", turn.completion_start, turn.completion_end
        start = turn.completion_end


def show_rollout(record: RolloutRecord, decode: Callable[[list[int]], str] | None) -> str:
    lines = [f"rollout {record.rollout_id}: {record.status}" + (f" ({record.failure.cause})" if record.failure else "")]
    lines.append(f"answer: {record.answer!r}  usage: {record.usage}")
    for sample in record.samples:
        chain = sample.chain
        flags = f" {sample.kind}" + (f" under sample {chain.parent}" if chain and chain.parent is not None else "")
        flags += f" turn {chain.parent_turn}" if chain and chain.parent_turn is not None else ""
        flags += f" by {chain.linked_by}" if chain and chain.linked_by else ""
        fork = f" fork: {sample.fork_reason}" if sample.fork_reason else ""
        lines.append(f"-- sample {sample.index}: {len(sample.input_ids)} tokens, {len(sample.turns)} turns{flags}{fork}")
        for kind, start, end in _spans(sample):
            ids = sample.input_ids[start:end]
            body = repr(decode(ids)) if decode else f"{len(ids)} ids"
            lines.append(f"[{kind} {start}:{end}] {body}")
        for number, turn in enumerate(sample.turns):
            extra = " malformed-tool-call" if turn.malformed_tool_call else ""
            extra += " spans-weight-sync" if turn.spans_sync else ""
            lines.append(f"   turn {number}: {turn.finish_reason}, policy v{turn.policy_version}{extra}")
    return "\n".join(lines)


def run_inspect_from_args(args: argparse.Namespace) -> int:
    def torn(line: int, size: int) -> None:
        print(f"note: line {line} of {args.file} is a torn write ({size} bytes, never acknowledged): skipped")

    records = list(read_records(args.file, on_torn=torn))
    if not args.rollout:
        for key, value in summarise(records).items():
            print(f"{key:>16}: {value}")
        return 0
    matches = [r for r in records if r.rollout_id == args.rollout]
    if not matches:
        print(f"no rollout {args.rollout!r} in {args.file}")
        return 1
    decode = None
    if args.model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    print(show_rollout(matches[-1], decode))
    return 0
