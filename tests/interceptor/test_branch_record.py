"""A branch's record: its ids kept as one JSON part per turn, which a turn's prompt and a copied branch refer to
rather than copy. What they give must be the ids recorded, whatever is recorded after them."""

from __future__ import annotations

import orjson

from interceptor.gate.branch_record import BranchRecord, Lineage, build_samples
from interceptor.tokens.ids_json import IdsJson, PromptJson

FIELDS = {"finish_reason": "stop", "malformed_tool_call": False, "model": "m", "policy_version": 0, "seconds": 0.0}


def branch_with(turns: list[tuple[list[int], list[int]]], number: int = 1) -> BranchRecord:
    branch = BranchRecord(number=number, tools_digest="t", system_digest="", fork_reason=None)
    for prompt, sampled in turns:
        branch.append_turn(IdsJson.of(prompt), sampled, [-0.5] * len(sampled), dict(FIELDS))
    return branch


def test_a_turns_prompt_is_the_recorded_ids_then_the_new_ones_and_later_turns_leave_it_as_it_was():
    branch = branch_with([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])])
    prompt = branch.prompt(IdsJson.of([10, 11]))
    assert prompt.count == 11 and orjson.loads(prompt.json) == list(range(1, 12))
    branch.append_turn(IdsJson.of([10, 11]), [12], [-0.1], dict(FIELDS))
    branch.append_turn(IdsJson.of([13]), [14], [-0.1], dict(FIELDS))
    assert orjson.loads(prompt.json) == list(range(1, 12))
    assert branch.ids() == list(range(1, 15))


def test_the_upstream_body_is_the_prompt_between_the_fields_before_and_after_it():
    branch = branch_with([([1, 2], [3])])
    prompt = branch.prompt(IdsJson.of([4]))
    assert orjson.loads(prompt.body(b'{"prompt":', b',"model":"m"}')) == {"prompt": [1, 2, 3, 4], "model": "m"}
    fresh = PromptJson.fresh(IdsJson.of([7, 8]))
    assert orjson.loads(fresh.body(b'{"prompt":', b"}")) == {"prompt": [7, 8]} and fresh.count == 2


def test_a_turn_with_nothing_new_and_nothing_sampled_keeps_every_part_in_step_with_its_turn():
    branch = branch_with([([1, 2], [3]), ([], []), ([4], [])])
    assert branch.ids() == [1, 2, 3, 4] and len(branch.parts) == len(branch.turns) == 3
    assert orjson.loads(branch.prompt(IdsJson.of([])).json) == [1, 2, 3, 4]
    assert branch.copy_through(3, number=2, fork_reason="x").ids() == [1, 2, 3]


def test_a_prompt_after_turns_that_recorded_no_ids_has_no_comma_before_its_first():
    branch = branch_with([([], []), ([], [])])
    prompt = branch.prompt(IdsJson.of([5, 6]))
    assert orjson.loads(prompt.json) == [5, 6] and prompt.count == 2


def test_a_branch_copied_through_a_turn_holds_the_ids_up_to_it_and_not_the_parents_later_turns():
    parent = branch_with([([1, 2], [3]), ([4], [5, 6])])
    child = parent.copy_through(3, number=2, fork_reason="edited")
    parent.append_turn(IdsJson.of([7]), [8], [-0.2], dict(FIELDS))
    child.append_turn(IdsJson.of([9]), [10], [-0.3], dict(FIELDS))
    assert parent.ids() == [1, 2, 3, 4, 5, 6, 7, 8] and child.ids() == [1, 2, 3, 9, 10]
    samples = build_samples([parent, child])
    assert samples[1].input_ids == [1, 2, 3, 9, 10]
    # Token 3 was sampled in the parent and is trained there: the copy keeps its turn but holds it as context.
    assert samples[0].completion_mask == [0, 0, 1, 0, 1, 1, 0, 1]
    assert samples[1].completion_mask == [0, 0, 0, 0, 1]
    assert samples[1].old_logprobs == [0.0, 0.0, 0.0, 0.0, -0.30000001192092896]
    assert len(samples[1].turns) == 2
    assert samples[1].chain.parent == 0 and samples[1].chain.shared == 3


def test_the_same_ids_sampled_in_two_samples_are_trained_in_the_first_only():
    first = branch_with([([1, 2], [3, 4]), ([5], [6])])
    second = branch_with([([1, 2], [3, 9])], number=2)  # the same prompt drew 3 again, then 9
    third = branch_with([([7], [8])], number=3)  # shares nothing
    samples = build_samples([first, second, third])
    assert [s.completion_mask for s in samples] == [[0, 0, 1, 1, 0, 1], [0, 0, 0, 1], [0, 1]]
    assert samples[1].old_logprobs == [0.0, 0.0, 0.0, -0.5]


def test_samples_form_one_tree_under_the_main_chain_whatever_order_the_chains_began_in():
    title = BranchRecord(number=1, tools_digest="", system_digest="s", fork_reason=None,
                         lineage=Lineage("auxiliary"))  # a title request made before the main one
    title.append_turn(IdsJson.of([1]), [2], [-0.1], dict(FIELDS))
    main = branch_with([([3, 4], [5])], number=2)
    main.lineage = Lineage("main")
    child = branch_with([([6], [7])], number=3)
    child.lineage = Lineage("subagent", 2, 0, "tool_call")
    samples = build_samples([title, main, child])
    assert [(s.chain.kind, s.chain.parent, s.chain.parent_turn, s.chain.linked_by) for s in samples] == [
        ("auxiliary", 1, None, "timing"), ("main", None, None, None), ("subagent", 1, 0, "tool_call")]
    assert [s.auxiliary for s in samples] == [True, False, False]
