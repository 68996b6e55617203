"""Rollout records for the viewer's tests, built from the product's own record types."""

from __future__ import annotations

from interceptor.store.records import Failure, RolloutRecord, SampleRecord, TurnRecord


def make_sample(index: int, *, auxiliary: bool = False, fork_reason: str | None = None,
                prefix: list[int] | None = None, turns: int = 2) -> SampleRecord:
    """A sample of `turns` turns: 5 prompt tokens then 3 sampled ones each, after `prefix` (a shared history)."""
    ids, mask, logprobs, records = list(prefix or []), [0] * len(prefix or []), [0.0] * len(prefix or []), []
    for turn in range(turns):
        start = len(ids)
        ids += [100 + index * 10 + turn + k for k in range(5)]
        mask += [0] * 5
        logprobs += [0.0] * 5
        completion = len(ids)
        ids += [200 + k for k in range(3)]
        mask += [1] * 3
        logprobs += [-0.1, -1.5, -0.01]
        records.append(TurnRecord(prompt_start=start, completion_start=completion, completion_end=len(ids),
                                  finish_reason="tool_calls" if turn < turns - 1 else "stop",
                                  malformed_tool_call=False, model="policy", policy_version=turn, seconds=0.01,
                                  spans_sync=turn == 0))  # its first turn ran across a weight sync
    return SampleRecord(index=index, input_ids=ids, completion_mask=mask, old_logprobs=logprobs, turns=records,
                        auxiliary=auxiliary, fork_reason=fork_reason)


def make_record(rollout_id: str, *, status: str = "ok", reward: float | None = 1.0, failure: Failure | None = None,
                samples: list[tuple[bool, str | None]] | None = None, task: str = "task-a", agent: str = "pi",
                answer: object = "5", started_at: float = 1000.0) -> RolloutRecord:
    """`samples`: (auxiliary, fork_reason) per sample; the first sample's tokens are the others' shared prefix."""
    shapes = samples if samples is not None else [(False, None)]
    built: list[SampleRecord] = []
    for i, (auxiliary, fork_reason) in enumerate(shapes):
        prefix = built[0].input_ids[:8] if built and not auxiliary else None
        built.append(make_sample(i, auxiliary=auxiliary, fork_reason=fork_reason, prefix=prefix))
    trace = [{"new_messages": [{"role": "system", "content": "You are a coding agent."},
                               {"role": "user", "content": "What is 2 + 3?"}],
              "response": {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function",
                   "function": {"name": "bash", "arguments": '{"command": "answer 5"}'}}]},
              "finish_reason": "tool_calls"},
             {"new_messages": [{"role": "tool", "tool_call_id": "c1", "content": "answer recorded"}],
              "response": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}]
    sampled = sum(sum(s.completion_mask) for s in built)
    return RolloutRecord(
        rollout_id=rollout_id, mode="interception_gate", status=status, samples=built, trace=trace,
        usage={"prompt_tokens": sum(len(s.input_ids) for s in built) - sampled, "completion_tokens": sampled,
               "turns": sum(len(s.turns) for s in built)},
        answer=answer, reward=reward, failure=failure, events=[{"kind": "graded", "at": started_at + 1}],
        metadata={"task_id": task, "agent": agent, "index": 0}, started_at=started_at, finished_at=started_at + 2,
    )
