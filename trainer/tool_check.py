"""The tool model build's check loop (`trainer.tool_model`): measure each check's margin, correct what falls short,
measure again, for a bounded number of rounds."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["corrected"]


def corrected(count: int, measure: Callable[[int], float], correct: Callable[[list[int]], None], *, rounds: int,
              margin: float) -> list[float]:
    """The margins of `count` checks after up to `rounds` rounds of `correct(short)` (one more step for each check
    whose margin falls short): at the final weights, every one of them. After a round only what fell short is measured
    again (a round of every check is ~2.5 s of agents' prompts on an AVX2 machine, and one agent's margin can take
    several rounds to rise); once it passes, every check is measured, and whatever fell short meanwhile goes on."""
    checked = [measure(check) for check in range(count)]

    def below(among) -> list[int]:
        return [check for check in among if checked[check] < margin]

    short, stale = below(range(count)), False  # stale: a margin in `checked` predates the last step
    for _ in range(rounds):
        if not short:
            break
        correct(short)
        for check in short:
            checked[check] = measure(check)
        short, stale = below(short), True
        if not short:
            checked, stale = [measure(check) for check in range(count)], False
            short = below(range(count))
    if stale:  # the check gave up: the margins are the final weights'
        checked = [measure(check) for check in range(count)]
    return checked
