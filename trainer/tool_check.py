"""The tool model build's check loop (`trainer.tool_model`): measure each check's margin, correct what falls short,
measure again, for a bounded number of rounds."""

from __future__ import annotations

from collections.abc import Callable, Collection

__all__ = ["corrected"]


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
