"""The questions the viewer's page asks of an index: a filtered, sorted page of rollouts, and the run's summary.

Query strings are validated here, once: an unknown parameter or a bad value is a `BadRequest` naming it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

from interceptor.errors import BadRequest
from interceptor.viewer.index import RecordIndex, Row

__all__ = ["RolloutQuery", "page", "run_summary"]

_SORTABLE = ("started_at", "finished_at", "reward", "turns", "prompt_tokens", "completion_tokens", "forks",
             "status", "task", "agent", "cause", "rollout_id")
_MAX_LIMIT = 1000
_FACET_VALUES = 200  # the most frequent values offered per filter


@dataclass(frozen=True, slots=True)
class RolloutQuery:
    status: str | None = None
    cause: str | None = None
    task: str | None = None
    agent: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    search: str | None = None  # a substring of the rollout id or the task
    sort: str = "started_at"
    descending: bool = True
    offset: int = 0
    limit: int = 50

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RolloutQuery:
        known = {"status", "cause", "task", "agent", "min_reward", "max_reward", "q", "sort", "order", "offset",
                 "limit"}
        if unknown := sorted(set(params) - known):
            raise BadRequest(f"unknown query parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        text = {k: v for k, v in params.items() if v != ""}
        sort = text.get("sort", "started_at")
        if sort not in _SORTABLE:
            raise BadRequest(f"sort must be one of {', '.join(_SORTABLE)}, not {sort!r}")
        order = text.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequest(f"order must be asc or desc, not {order!r}")
        return cls(
            status=text.get("status"), cause=text.get("cause"), task=text.get("task"), agent=text.get("agent"),
            min_reward=_number(text, "min_reward"), max_reward=_number(text, "max_reward"), search=text.get("q"),
            sort=sort, descending=order == "desc",
            offset=_integer(text, "offset", 0, 0, None), limit=_integer(text, "limit", 50, 1, _MAX_LIMIT),
        )

    def matches(self, row: Row) -> bool:
        if self.status is not None and row.status != self.status:
            return False
        if self.cause is not None and (row.cause or "") != self.cause:
            return False
        if self.task is not None and row.task != self.task:
            return False
        if self.agent is not None and row.agent != self.agent:
            return False
        if self.min_reward is not None and (row.reward is None or row.reward < self.min_reward):
            return False
        if self.max_reward is not None and (row.reward is None or row.reward > self.max_reward):
            return False
        return self.search is None or self.search in row.rollout_id or self.search in row.task


def _number(params: Mapping[str, str], name: str) -> float | None:
    if name not in params:
        return None
    try:
        value = float(params[name])
    except ValueError:
        raise BadRequest(f"{name} must be a number, not {params[name]!r}") from None
    if not math.isfinite(value):
        raise BadRequest(f"{name} must be finite")
    return value


def _integer(params: Mapping[str, str], name: str, default: int, low: int, high: int | None) -> int:
    if name not in params:
        return default
    try:
        value = int(params[name])
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {params[name]!r}") from None
    if value < low or (high is not None and value > high):
        raise BadRequest(f"{name} must be between {low} and {high if high is not None else 'any'}, not {value}")
    return value


def _sort_key(name: str):
    if name == "forks":
        return lambda row: row.forks
    if name in ("reward", "finished_at"):  # rows without one sort first (ascending)
        return lambda row: (getattr(row, name) is not None, getattr(row, name) or 0.0)
    if name == "cause":
        return lambda row: row.cause or ""
    return attrgetter(name)


def page(index: RecordIndex, query: RolloutQuery) -> dict:
    """One page of the rows that match, the total that match, and the values each filter can take."""
    rows = [row for row in index.rows if query.matches(row)]
    rows.sort(key=_sort_key(query.sort), reverse=query.descending)
    chosen = rows[query.offset:query.offset + query.limit]
    facets = {
        name: [value for value, _ in Counter(getattr(r, name) or "" for r in index.rows).most_common(_FACET_VALUES)]
        for name in ("status", "cause", "task", "agent")
    }
    return {"total": len(rows), "offset": query.offset, "rows": [row.to_json_dict() for row in chosen],
            "facets": facets, "version": index.version}


def run_summary(index: RecordIndex, *, buckets: int = 60) -> dict:
    """What the run did: rollouts by status, failures by cause, rewards, forks, turns and tokens per second over
    time (from the records' start and finish times), and the training steps' curves."""
    rows = index.rows
    status = Counter(row.status for row in rows)
    causes = Counter(row.cause for row in rows if row.cause)
    rewards = [row.reward for row in rows if row.reward is not None]
    finished = sorted((row for row in rows if row.finished_at), key=lambda row: row.finished_at)
    rate: list[dict] = []
    if finished:
        start = min(row.started_at or row.finished_at for row in finished)
        span = max(finished[-1].finished_at - start, 1e-9)
        width = span / buckets
        turns, tokens, count = [0] * buckets, [0] * buckets, [0] * buckets
        for row in finished:
            at = min(buckets - 1, int((row.finished_at - start) / width))
            turns[at] += row.turns
            tokens[at] += row.completion_tokens
            count[at] += 1
        rate = [{"t": round((i + 1) * width, 3), "turns_per_s": turns[i] / width,
                 "sampled_tokens_per_s": tokens[i] / width, "rollouts": count[i]} for i in range(buckets)]
    curves = {}
    for name in ("reward", "loss", "sample/staleness_mean", "sample/staleness_max", "logprob_gap/mean", "forks",
                 "kl", "entropy"):
        points = [[s["step"], s[name]] for s in index.steps
                  if isinstance(s.get(name), (int, float)) and isinstance(s.get("step"), (int, float))]
        if points:
            curves[name] = points
    return {
        "files": [str(p) for p in index.files],
        "metrics_file": str(index.metrics) if index.metrics and index.metrics.exists() else None,
        "rollouts": len(rows),
        "skipped_lines": index.skipped,
        "by_status": dict(status),
        "failures_by_cause": dict(causes),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "graded": len(rewards),
        "forks": sum(row.forks for row in rows),
        "auxiliary": sum(row.auxiliary for row in rows),
        "turns": sum(row.turns for row in rows),
        "sampled_tokens": sum(row.completion_tokens for row in rows),
        "prompt_tokens": sum(row.prompt_tokens for row in rows),
        "rate": rate,
        "steps": len(index.steps),
        "curves": curves,
        "version": index.version,
    }
