"""A journal that contradicts itself (a fork said to start where no turn ended, a turn whose positions do not follow
from its ids) costs only that rollout's later turns: recovery goes on, and every other rollout comes back whole."""

from __future__ import annotations

from interceptor.store.journal import Journal, recover_journal

TURN = {"finish_reason": "stop", "malformed_tool_call": False, "model": "m", "policy_version": 0, "seconds": 0.0}


def turn_event(branch: int, prompt: list[int], sampled: list[int], start: int, origin=None) -> dict:
    completion_start = start + len(prompt)
    event = {"b": branch, "p": prompt, "t": sampled, "l": [-0.5] * len(sampled),
             "turn": {**TURN, "prompt_start": start, "completion_start": completion_start,
                      "completion_end": completion_start + len(sampled)},
             "o": origin, "fr": None if origin is None else "concurrent turn", "tk": "", "sk": ""}
    return event


def test_a_contradictory_journal_line_costs_only_its_rollout_the_turns_after_it(tmp_path):
    record = tmp_path / "rollouts.jsonl"
    journal = Journal(record)
    for rollout in ("good", "bad"):
        journal.opened(rollout_id=rollout, mode="interception_gate", metadata={}, started_at=0.0)
        journal.turn(rollout, branch=turn_event(1, [1, 2, 3], [4, 5], 0), trace={"n": 1}, usage=(3, 2))
    journal.turn("bad", branch=turn_event(2, [6], [7], 3, origin=(1, 3)), trace={"n": 2}, usage=(1, 1))  # 3 ends no turn
    journal.turn("good", branch=turn_event(1, [6], [7], 5), trace={"n": 2}, usage=(1, 1))
    journal.close(remove=False)

    records = {r.rollout_id: r for r in recover_journal(record)}
    assert set(records) == {"good", "bad"}
    (good,) = records["good"].samples
    assert good.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert good.completion_mask == [0, 0, 0, 1, 1, 0, 1]
    assert good.old_logprobs == [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    (bad,) = records["bad"].samples
    assert bad.input_ids == [1, 2, 3, 4, 5]  # its first turn, intact; the contradictory fork left out
