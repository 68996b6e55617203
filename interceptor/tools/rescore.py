"""`interceptor rescore RECORDS --upstream URL`: how far a policy server's logprobs are from the recorded ones.

Each training sample's `input_ids` go to the server's `/v1/completions` as a token-id prompt with `max_tokens=1`
and `prompt_logprobs=0`: vLLM (and the local engine) then return, per prompt position, a dict keyed by token id
(as a string) holding the logprob of the actual token given exactly the tokens before it (None at position 0).
Over the sampled tokens (`completion_mask == 1`) the gap |rescored - recorded old_logprob| is summarised per
rollout and overall (mean, p50, p99, max, token count), with the worst positions. Against the generator that
recorded the samples, with the same weights, the gap is rounding (a check that generation is deterministic and
the records token-exact); against a later policy it measures the drift.

Requests run `concurrency` at a time, each under `timeout_s`. A sample longer than the server's `max_model_len`
(read from `/v1/models`, or a 400 about the context length) is reported as skipped, with the reason; any other
upstream failure, or a reply without `prompt_logprobs`, stops the run with a `RescoreError` naming the rollout,
the sample and the status. The API key of a remote server comes from `INTERCEPTOR_UPSTREAM_API_KEY` only.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import orjson

from interceptor.errors import ConfigError
from interceptor.store.recorder import read_records
from interceptor.store.records import RolloutRecord, SampleRecord

__all__ = [
    "API_KEY_ENV",
    "GapStats",
    "RescoreConfig",
    "RescoreError",
    "RescoreReport",
    "RolloutGap",
    "SkippedSample",
    "TokenGap",
    "format_report",
    "rescore",
    "run_rescore_from_args",
]

API_KEY_ENV = "INTERCEPTOR_UPSTREAM_API_KEY"  # the only source of the key: argv is visible to every local user
_ERROR_TEXT_KEPT = 300  # characters of an upstream's error body quoted in a message
# vLLM's (and the local engine's) wordings of a prompt too long for the context window.
_CONTEXT_LENGTH_WORDS = ("context length", "maximum model length", "max_model_len")


class RescoreError(Exception):
    """The rescoring could not be completed: the server failed, or answered without what it was asked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RescoreConfig:
    upstream: str  # the policy server's base URL, with or without `/v1`
    model: str | None = None  # the served model name; None: the first one `/v1/models` lists
    api_key: str | None = field(default=None, repr=False)
    concurrency: int = 4  # requests in flight at once
    timeout_s: float = 600.0  # one sample's scoring: long, since a CPU policy server is slow on long prompts
    worst: int = 10  # how many of the largest gaps the report lists
    # only samples every turn of which this policy version sampled (a training run's records hold many versions;
    # the server holds one); a turn that spans a weight sync holds two and is listed as skipped. None: every sample
    policy_version: int | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"the upstream must be an http(s) URL with a host, not {self.upstream!r}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, not {self.concurrency}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be positive, not {self.timeout_s}")
        if self.worst < 0:
            raise ConfigError(f"worst must not be negative, not {self.worst}")
        if self.policy_version is not None and self.policy_version < 0:
            raise ConfigError(f"policy_version must not be negative, not {self.policy_version}")

    @property
    def root(self) -> str:
        """The base URL without a trailing `/v1`, so both spellings work."""
        url = self.upstream.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenGap:
    rollout_id: str
    sample: int  # the sample's index in its rollout
    index: int  # the token's position in the sample's input_ids
    token_id: int
    recorded: float  # the old_logprob the generator sampled it with
    rescored: float  # the server's logprob of it now
    gap: float  # |rescored - recorded|


@dataclass(frozen=True, slots=True, kw_only=True)
class GapStats:
    tokens: int
    mean: float
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, gaps: Sequence[float]) -> GapStats:
        ordered = sorted(gaps)
        if not ordered:
            return cls(tokens=0, mean=0.0, p50=0.0, p99=0.0, max=0.0)
        return cls(tokens=len(ordered), mean=math.fsum(ordered) / len(ordered), p50=_quantile(ordered, 0.5),
                   p99=_quantile(ordered, 0.99), max=ordered[-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutGap:
    rollout_id: str
    samples: int  # samples scored (skipped ones not counted)
    stats: GapStats


@dataclass(frozen=True, slots=True, kw_only=True)
class SkippedSample:
    rollout_id: str
    sample: int
    tokens: int  # the sample's length
    reason: str


@dataclass(frozen=True, slots=True)
class _Scored:
    """One sample's gaps, and only its largest as positions: a run has millions of sampled tokens."""

    gaps: list[float]
    worst: list[TokenGap]


@dataclass(frozen=True, slots=True, kw_only=True)
class RescoreReport:
    upstream: str
    model: str
    overall: GapStats
    rollouts: tuple[RolloutGap, ...]
    worst: tuple[TokenGap, ...]  # the largest gaps, largest first
    skipped: tuple[SkippedSample, ...]

    def to_json(self) -> bytes:
        return orjson.dumps(self, option=orjson.OPT_INDENT_2)


# ----------------------------------------------------------------------------------------------- scoring


async def rescore(records: Iterable[RolloutRecord], config: RescoreConfig) -> RescoreReport:
    """Score every sample of `records` that has sampled tokens on `config.upstream`; see the module docstring."""
    version = config.policy_version
    samples = [(r.rollout_id, s) for r in records for s in r.samples if s.completion_tokens
               and (version is None or all(t.policy_version == version for t in s.turns))]
    if not samples:
        at = "" if version is None else f" sampled at policy version {version}"
        raise RescoreError(f"the records hold no sample with sampled tokens{at}: nothing to rescore")
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    connector = aiohttp.TCPConnector(limit=config.concurrency)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as http:
        model, max_model_len = await _discover(http, config)
        limit = asyncio.Semaphore(config.concurrency)
        results: list[_Scored | SkippedSample | None] = [None] * len(samples)

        async def score(slot: int, rollout_id: str, sample: SampleRecord) -> None:
            spanning = [n for n, t in enumerate(sample.turns) if t.spans_sync] if version is not None else []
            if spanning:
                results[slot] = SkippedSample(
                    rollout_id=rollout_id, sample=sample.index, tokens=len(sample.input_ids),
                    reason=f"turn {spanning[0]} spans a weight sync: its tail may be a later version's than {version}",
                )
                return
            if max_model_len is not None and len(sample.input_ids) + 1 > max_model_len:
                results[slot] = SkippedSample(
                    rollout_id=rollout_id, sample=sample.index, tokens=len(sample.input_ids),
                    reason=f"{len(sample.input_ids)} tokens and 1 to generate exceed the server's max_model_len "
                           f"{max_model_len}",
                )
                return
            async with limit:
                results[slot] = await _score_sample(http, config, model, rollout_id, sample)

        try:
            async with asyncio.TaskGroup() as tasks:
                for slot, (rollout_id, sample) in enumerate(samples):
                    tasks.create_task(score(slot, rollout_id, sample))
        except* RescoreError as group:  # the first failure stops the run (the others were cancelled with it)
            raise group.exceptions[0] from None
    return _report(config, model, samples, results)


async def _discover(http: aiohttp.ClientSession, config: RescoreConfig) -> tuple[str, int | None]:
    """The model to name in requests and the server's max_model_len (None when it does not say)."""
    url = f"{config.root}/v1/models"
    try:
        async with asyncio.timeout(config.timeout_s), http.get(url) as response:
            raw = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RescoreError(f"cannot reach the policy server at {url}: {_describe(exc)}") from exc
    if status != 200:
        raise RescoreError(f"{url} answered {status}: {_error_text(raw)}")
    try:
        cards = [c for c in orjson.loads(raw)["data"] if isinstance(c, dict) and isinstance(c.get("id"), str)]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise RescoreError(f"{url} did not answer with a model list: {_error_text(raw)}") from exc
    card = next((c for c in cards if config.model in (None, c["id"])), None)
    if card is None:
        if config.model is None:
            raise RescoreError(f"{url} lists no model")
        return config.model, None  # a server that does not list the model may still serve it (an alias)
    length = card.get("max_model_len")
    return card["id"], length if isinstance(length, int) and not isinstance(length, bool) else None


async def _score_sample(
    http: aiohttp.ClientSession, config: RescoreConfig, model: str, rollout_id: str, sample: SampleRecord
) -> _Scored | SkippedSample:
    where = f"rollout {rollout_id} sample {sample.index}"
    body = {"model": model, "prompt": sample.input_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    try:
        async with asyncio.timeout(config.timeout_s):
            async with http.post(f"{config.root}/v1/completions", json=body) as response:
                raw = await response.read()
                status = response.status
    except TimeoutError as exc:
        raise RescoreError(f"{where}: no answer from the policy server within {config.timeout_s:g}s") from exc
    except aiohttp.ClientError as exc:
        raise RescoreError(f"{where}: the policy server failed: {_describe(exc)}") from exc
    if status != 200:
        message = _error_text(raw)
        if status == 400 and any(words in message for words in _CONTEXT_LENGTH_WORDS):
            return SkippedSample(rollout_id=rollout_id, sample=sample.index, tokens=len(sample.input_ids),
                                 reason=message)
        raise RescoreError(f"{where}: the policy server answered {status}: {message}")
    return _gaps(rollout_id, sample, _prompt_logprobs(raw, status, sample, where), worst=config.worst)


def _prompt_logprobs(raw: bytes, status: int, sample: SampleRecord, where: str) -> list[float | None]:
    """The server's logprob of each token of the sample (None where it gives none: the first position)."""
    try:
        entries = orjson.loads(raw)["choices"][0]["prompt_logprobs"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise RescoreError(f"{where}: the reply is not a completion: {_error_text(raw)}") from exc
    if not isinstance(entries, list):
        raise RescoreError(f"{where}: the policy server answered {status} without prompt_logprobs (does it support "
                           "them?)")
    if len(entries) != len(sample.input_ids):
        raise RescoreError(f"{where}: the reply has {len(entries)} prompt_logprobs for {len(sample.input_ids)} tokens")
    out: list[float | None] = []
    for index, (entry, token) in enumerate(zip(entries, sample.input_ids, strict=True)):
        try:
            out.append(None if entry is None else float(entry[str(token)]["logprob"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise RescoreError(f"{where}: prompt_logprobs[{index}] has no logprob for token {token}") from exc
    return out


def _gaps(rollout_id: str, sample: SampleRecord, rescored: list[float | None], *, worst: int) -> _Scored:
    gaps: list[float] = []
    positions: list[int] = []
    for index, mask in enumerate(sample.completion_mask):
        if not mask:
            continue
        now = rescored[index]
        if now is None:  # a sample that starts with a sampled token: nothing conditions it, the server gives none
            raise RescoreError(f"rollout {rollout_id} sample {sample.index}: token {index} is sampled but the "
                               "server gives no logprob for it")
        gaps.append(abs(now - sample.old_logprobs[index]))
        positions.append(index)
    largest = heapq.nlargest(worst, range(len(gaps)), key=gaps.__getitem__)
    return _Scored(gaps, [
        TokenGap(rollout_id=rollout_id, sample=sample.index, index=at, token_id=sample.input_ids[at],
                 recorded=sample.old_logprobs[at], rescored=rescored[at], gap=gaps[i])
        for i, at in ((i, positions[i]) for i in largest)
    ])


def _report(
    config: RescoreConfig, model: str, samples: list[tuple[str, SampleRecord]],
    results: list[_Scored | SkippedSample | None],
) -> RescoreReport:
    by_rollout: dict[str, list[_Scored]] = {}
    skipped: list[SkippedSample] = []
    for (rollout_id, _), result in zip(samples, results, strict=True):
        if isinstance(result, SkippedSample):
            skipped.append(result)
        elif result is not None:  # every slot is filled once the task group has ended without an error
            by_rollout.setdefault(rollout_id, []).append(result)
    rollouts = tuple(
        RolloutGap(rollout_id=rollout_id, samples=len(scored), stats=GapStats.of([g for s in scored for g in s.gaps]))
        for rollout_id, scored in by_rollout.items()
    )
    every = [s for scored in by_rollout.values() for s in scored]
    return RescoreReport(
        upstream=config.upstream, model=model, overall=GapStats.of([g for s in every for g in s.gaps]),
        rollouts=rollouts, skipped=tuple(skipped),
        worst=tuple(heapq.nlargest(config.worst, (g for s in every for g in s.worst), key=lambda g: g.gap)),
    )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated between the two nearest ranks (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _error_text(raw: bytes) -> str:
    try:
        message = orjson.loads(raw)["error"]["message"]
        if isinstance(message, str):
            return message[:_ERROR_TEXT_KEPT]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return raw.decode(errors="replace")[:_ERROR_TEXT_KEPT] or "(empty body)"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_KEPT]


# ----------------------------------------------------------------------------------------------- command line


def format_report(report: RescoreReport) -> str:
    lines = [f"rescored on {report.upstream} (model {report.model}): |rescored - recorded| logprob over sampled tokens",
             f"{'rollout':<36} {'samples':>7} {'tokens':>7} {'mean':>10} {'p50':>10} {'p99':>10} {'max':>10}"]
    for row in report.rollouts:
        lines.append(_stats_row(row.rollout_id, str(row.samples), row.stats))
    lines.append(_stats_row("all", str(sum(r.samples for r in report.rollouts)), report.overall))
    if report.worst:
        lines += ["", "worst positions:",
                  f"{'rollout':<36} {'sample':>6} {'index':>6} {'token':>7} {'recorded':>10} {'rescored':>10} "
                  f"{'gap':>10}"]
        for g in report.worst:
            lines.append(f"{g.rollout_id:<36} {g.sample:>6} {g.index:>6} {g.token_id:>7} {g.recorded:>10.4f} "
                         f"{g.rescored:>10.4f} {g.gap:>10.3g}")
    if report.skipped:
        lines += ["", f"skipped {len(report.skipped)} samples:"]
        for s in report.skipped:
            lines.append(f"  rollout {s.rollout_id} sample {s.sample} ({s.tokens} tokens): {s.reason}")
    return "\n".join(lines)


def _stats_row(name: str, samples: str, stats: GapStats) -> str:
    return (f"{name:<36} {samples:>7} {stats.tokens:>7} {stats.mean:>10.3g} {stats.p50:>10.3g} {stats.p99:>10.3g} "
            f"{stats.max:>10.3g}")


def run_rescore_from_args(args: argparse.Namespace) -> int:
    """0: the report was printed; 1: the server failed; 2: the inputs are not usable."""
    try:
        given = {"concurrency": args.concurrency, "timeout_s": args.timeout, "policy_version": args.policy_version}
        config = RescoreConfig(upstream=args.upstream, model=args.model, api_key=os.environ.get(API_KEY_ENV) or None,
                               **{name: value for name, value in given.items() if value is not None})
        records = _read(Path(args.records))
    except ConfigError as exc:
        print(f"interceptor rescore: error: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(rescore(records, config))
    except RescoreError as exc:
        print(f"interceptor rescore: error: {exc}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json:
        Path(args.json).write_bytes(report.to_json())
    return 0


def _read(path: Path) -> list[RolloutRecord]:
    """The records of `path`, checked to hold something to rescore."""
    if not path.is_file():
        raise ConfigError(f"no records file at {path}")
    try:
        records = list(read_records(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not any(s.completion_tokens for r in records for s in r.samples):
        raise ConfigError(f"{path} holds no sample with sampled tokens ({len(records)} rollouts): nothing to rescore")
    return records
