"""What the tool model's training steps are made of (`trainer.models.tool_episodes` draws them, `trainer.models.tool_model` trains
and checks on them): an episode's token ids and the mask of the tokens the model is taught to write, and a step's
episodes; the masks the build's checks score (`trainer.models.tool_check`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Episode", "Step", "first_target", "last_target"]


@dataclass(frozen=True)
class Episode:
    ids: list[int]
    mask: list[bool]  # True on the tokens the model is taught to write
    context: int = 0  # leading ids that are context only, run without gradient (an agent's long prompt)
    # ids [start, end) that the step's episodes share between their own task and their first target (Claude Code's
    # ~2k-token environment after the task): run once for the step, without gradient; (0, 0) when there are none
    shared_after: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Step:
    rows: list[Episode]  # synthetic episodes packed back to back, one per row
    agents: list[Episode]  # episodes behind one agent's real prompt (the same context ids), or none
    episodes: int

    def all(self) -> list[Episode]:
        return self.rows + self.agents


def last_target(mask: list[bool]) -> list[bool]:
    """The mask with only its last run of targets kept (an episode's answer after the tool response)."""
    cut = len(mask) - mask[::-1].index(False)
    return [False] * cut + mask[cut:]


def first_target(mask: list[bool]) -> list[bool]:
    """The mask with only its first target token kept (the first call's `<tool_call>`: whether the turn calls)."""
    start = mask.index(True)
    return [False] * start + [True] + [False] * (len(mask) - start - 1)
