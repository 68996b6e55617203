"""The tool model build's check (`trainer.models.tool_check`). `corrected`, its loop: after a round only what fell short is
measured again, every other check once that passes, no check twice at the same weights, and the margins it returns
are all the final weights'. The "model" here is a version number that each corrective round advances, and each
check's margin a table of it. `BuildChecks`: what is checked, and which step corrects each check that falls short."""

from __future__ import annotations

from trainer.models.tool_check import BuildChecks, corrected
from trainer.models.tool_model import ToolTrainingSpec
from trainer.models.tool_steps import Episode
from trainer.models.tool_texts import TOOL_OUTPUTS


class Model:
    def __init__(self, margins: list[list[float]]) -> None:
        self.margins = margins  # margins[version][check]
        self.version = 0
        self.corrections: list[list[int]] = []
        self.measured: list[tuple[int, int]] = []  # (version, check)

    def measure(self, check: int) -> float:
        assert (self.version, check) not in self.measured, "measured twice at the same weights"
        self.measured.append((self.version, check))
        return self.margins[self.version][check]

    def correct(self, short: list[int]) -> None:
        self.corrections.append(list(short))
        self.version += 1

    def run(self, *, rounds: int = 16) -> list[float]:
        return corrected(len(self.margins[0]), self.measure, self.correct, rounds=rounds, margin=1.0)


def test_a_check_that_passes_at_once_corrects_nothing_and_measures_each_check_once():
    model = Model([[1.5, 2.0, 1.0]])
    assert model.run() == [1.5, 2.0, 1.0]
    assert model.corrections == []
    assert model.measured == [(0, 0), (0, 1), (0, 2)]


def test_after_a_round_only_the_checks_that_fell_short_are_measured_again():
    model = Model([[0.5, 2.0, 2.0], [0.8, 2.0, 2.0], [1.2, 2.0, 2.0]])
    assert model.run() == [1.2, 2.0, 2.0]
    assert model.corrections == [[0], [0]]
    assert model.measured == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2)]


def test_a_check_that_fell_short_meanwhile_is_corrected_after_the_full_measure():
    model = Model([[0.5, 2.0, 2.0], [1.5, 0.8, 2.0], [1.4, 1.2, 2.0]])
    assert model.run() == [1.4, 1.2, 2.0]
    assert model.corrections == [[0], [1]]
    assert all(version == 2 for version, _ in model.measured[-3:])


def test_a_check_that_gives_up_returns_every_margin_at_the_final_weights():
    model = Model([[0.5, 2.0], [0.6, 1.9], [0.7, 1.8], [0.8, 0.9]])
    assert model.run(rounds=3) == [0.8, 0.9]
    assert model.corrections == [[0], [0], [0]]
    assert model.measured[-2:] == [(3, 0), (3, 1)]


def test_a_check_that_gives_up_does_not_measure_again_what_passed_in_its_last_round():
    model = Model([[0.5, 0.5, 2.0], [1.5, 0.6, 2.0]])
    assert model.run(rounds=1) == [1.5, 0.6, 2.0]
    assert model.measured[3:] == [(1, 0), (1, 1), (1, 2)]


def test_no_rounds_measures_once_and_corrects_nothing():
    model = Model([[0.5, 2.0]])
    assert model.run(rounds=0) == [0.5, 2.0]
    assert model.corrections == []


class Maker:
    """What `BuildChecks` asks of an `EpisodeMaker`, each answer naming what was asked."""

    agents = 2

    def agent_episodes(self, agent, count, *, exact):  # sharing text after the task, as Claude Code's episodes do
        return [Episode(ids=[agent, 0, 0], mask=[False, False, True], shared_after=(1, 2))] * count

    def response_checks(self, count, *, seed):
        return [[f"response {r}"] * count for r in range(len(TOOL_OUTPUTS))]

    def first_turn_checks(self, count, *, seed):
        return ["first turn"] * count

    def step(self, agent):
        return ("agent step", agent)

    def response_step(self, responses):
        return ("response step", responses)

    def first_turn_step(self):
        return ("first turn step",)


def whole(agent: int) -> Episode:
    return Episode(ids=[agent, 0, 0], mask=[False, False, True])


def test_the_build_checks_each_agent_each_response_and_the_first_calls_and_corrects_each_in_its_own_way():
    spec = ToolTrainingSpec(check_responses=True, check_first_turns=3, check_episodes=2)
    checks = BuildChecks.draw(Maker(), spec)
    responses = len(TOOL_OUTPUTS)
    assert len(checks.steps) == 2 + responses + 1
    assert [s.agents for s in checks.steps[:2]] == [[whole(0)] * 2, [whole(1)] * 2]  # each run whole, none shared
    assert checks.steps[2].rows == ["response 0"] * 2 and checks.steps[-1].rows == ["first turn"] * 3
    short = [1, 2, 4, 2 + responses]  # agent 1, the first and third responses, the first calls
    assert list(checks.corrections(Maker(), short)) == [
        ("agent step", 1), ("response step", (TOOL_OUTPUTS[0], TOOL_OUTPUTS[2])), ("first turn step",)]
    margins = [1.5, 2.0] + [3.0 + r for r in range(responses)] + [0.5]
    assert checks.margins(margins) == ([1.5, 2.0], 3.0, 0.5)


def test_checks_left_off_are_neither_drawn_nor_corrected_nor_reported():
    checks = BuildChecks.draw(Maker(), ToolTrainingSpec(check_responses=False, check_first_turns=0))
    assert len(checks.steps) == 2
    assert list(checks.corrections(Maker(), [0])) == [("agent step", 0)]
    assert checks.margins([1.0, 2.0]) == ([1.0, 2.0], None, None)
