"""bench_gate.py's output: one table per measure, and the method line under them."""

from __future__ import annotations

__all__ = ["METHOD", "print_table"]

METHOD = ("method: one load-generator process (aiohttp), each server its own process, instant fake upstream; "
          "targets round robin per turn; added = target - direct in the same round, for every target "
          "(over_tokens_call: gate - direct_tokens, beside it); ratios are of added ms; throughput slices alternate "
          "targets.")


def print_table(results: dict) -> None:
    """One table per measure: a row per target, a column per figure ("-": not measured for that target)."""
    for section, rows in results.items():
        print(f"\n{section}")
        notes = {key: value for key, value in rows.items() if not isinstance(value, dict)}
        if notes:
            print("  " + ", ".join(f"{key}: {value}" for key, value in notes.items()))
        table = {name: row for name, row in rows.items() if isinstance(row, dict)}
        columns = list(dict.fromkeys(key for row in table.values() for key in row))
        widths = [max(len(column), 7) for column in columns]
        print("  " + f"{'target':<14}" + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
        for name, row in table.items():
            print("  " + f"{name:<14}" + " ".join(f"{_cell(row.get(c)):>{w}}" for c, w in zip(columns, widths)))
    print("\n" + METHOD)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
