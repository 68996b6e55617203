"""The tool model build's check (`trainer.models.tool_model`): what it checks (`BuildChecks`), and its loop (`corrected`):
measure each check's margin, correct what falls short, measure again, for a bounded number of rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.models.tool_steps import Episode, Step
from trainer.models.tool_texts import TOOL_OUTPUTS

if TYPE_CHECKING:
    from trainer.models.tool_episodes import EpisodeMaker
    from trainer.models.tool_model import ToolTrainingSpec

__all__ = ["BuildChecks", "corrected"]


@dataclass(frozen=True)
class BuildChecks:
    """The checks, in order: `check_episodes` exact episodes behind each agent's prompt; with `check_responses`,
    "Done." after each tool response in the plainest request (a group each); with `check_first_turns`, whether the
    first turn calls a tool in that many synthetic requests (one group). Drawn once (their own seeds for the last
    two), so that a round's margins differ from the last round's by what the steps changed."""

    steps: list[Step]
    agents: int
    responses: int  # groups after the agents'
    first_turns: bool

    @classmethod
    def draw(cls, maker: EpisodeMaker, spec: ToolTrainingSpec) -> BuildChecks:
        steps = [Step(rows=[], agents=_whole(maker.agent_episodes(agent, spec.check_episodes, exact=True)),
                      episodes=spec.check_episodes) for agent in range(maker.agents)]
        groups = maker.response_checks(spec.check_episodes, seed=spec.seed + 1) if spec.check_responses else []
        steps += [Step(rows=group, agents=[], episodes=len(group)) for group in groups]  # one row each
        if spec.check_first_turns:
            first = maker.first_turn_checks(spec.check_first_turns, seed=spec.seed + 2)
            steps.append(Step(rows=first, agents=[], episodes=len(first)))
        return cls(steps=steps, agents=maker.agents, responses=len(groups), first_turns=bool(spec.check_first_turns))

    def corrections(self, maker: EpisodeMaker, short: list[int]) -> Iterator[Step]:
        """One more step for each agent short (fresh episodes behind its prompt), one of plain episodes ending in
        the responses short, one of synthetic episodes if the first calls are: drawn as they are trained."""
        for agent in (check for check in short if check < self.agents):
            yield maker.step(agent=agent)
        responses_end = self.agents + self.responses
        if responses := tuple(TOOL_OUTPUTS[check - self.agents] for check in short
                              if self.agents <= check < responses_end):
            yield maker.response_step(responses)
        if self.first_turns and responses_end in short:
            yield maker.first_turn_step()

    def margins(self, checked: list[float]) -> tuple[list[float], float | None, float | None]:
        """The agents' margins, the responses' smallest and the first calls' (None where not checked)."""
        responses = checked[self.agents:self.agents + self.responses]
        return (checked[:self.agents], min(responses) if responses else None,
                checked[-1] if self.first_turns else None)


def _whole(episodes: list[Episode]) -> list[Episode]:
    """Check episodes that run all their own text: none shares the text after its task (Claude Code's environment),
    which a training step runs once, after the first episode's task. That saves a step most of the environment's
    cost, but each other episode's states there are an approximation whose error depends on the weights (on a build
    whose products ran in bf16, one number's end was 3.8 logits off); the check decides whether the build is done,
    so it measures each episode exactly, for a few thousand tokens more per agent (no gradient)."""
    return [dataclasses.replace(episode, shared_after=(0, 0)) for episode in episodes]


def corrected(count: int, measure: Callable[[int], float], correct: Callable[[list[int]], None], *, rounds: int,
              margin: float) -> list[float]:
    """The margins of `count` checks after up to `rounds` rounds of `correct(short)` (one more step for each check
    whose margin falls short): at the final weights, every one of them. After a round only what fell short is measured
    again (a round of every check is ~2.5 s of agents' prompts on an AVX2 machine, and one agent's margin can take
    several rounds to rise); once it passes, every other check is, and whatever fell short meanwhile goes on. No
    check is measured twice at the same weights."""
    checked = [measure(check) for check in range(count)]

    def below(among) -> list[int]:
        return [check for check in among if checked[check] < margin]

    def measure_but(measured: Collection[int]) -> None:  # every other check, at the weights `measured` were measured at
        for check in range(count):
            if check not in measured:
                checked[check] = measure(check)

    short, fresh = below(range(count)), range(count)  # fresh: the checks measured at the current weights
    for _ in range(rounds):
        if not short:
            break
        correct(short)
        for check in short:
            checked[check] = measure(check)
        fresh, short = short, below(short)
        if not short:
            measure_but(fresh)
            short, fresh = below(range(count)), range(count)
    measure_but(fresh)  # where the check gave up: the margins are the final weights'
    return checked
