"""Rollouts and their secrets.

Each rollout has a random id (part of its URL) and two random bearer secrets: the chat secret (the agent's API
key; it opens every endpoint of the rollout) and the tools secret, which opens only `/tools/*`, for programs the
agent's tools run (an `answer` command) that must not hold a credential to the model. `authorize` compares in
constant time, and one rollout's secrets open nothing else. Finished rollouts keep only a digest of their secret
and their status, so a late request gets a clear 409 (with the right secret) instead of a confusing 404.
The secret is never part of a `repr`, a log line or a record: `Rollout.scrub` replaces both secrets in anything
the rollout records (an agent that runs `env` puts its key into a tool result).

Each turn's tries (the agent's retries send the same body) share one `Attempts`: the answer, whether it reached
the agent, and the upstream calls left. A try is answered from the record when the first answer is still being
generated, never reached the agent, or the SDK says it is a retry (`X-Stainless-Retry-Count`); a deliberate
repeat of a request whose answer was delivered is sampled again.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from interceptor.config import SamplingSettings
from interceptor.errors import Conflict, NotFound, Unauthorized
from interceptor.gate.stop_rules import StopHit
from interceptor.gate.trajectory import Trajectory
from interceptor.store.journal import Journal
from interceptor.store.lineage_audit import audit_lineage
from interceptor.store.records import Failure, RolloutRecord, RolloutStatus
from interceptor.store.trace_log import TraceLog
from interceptor.transport.upstream import AttemptBudget
from interceptor.wire.body_cache import BodyCache
from interceptor.wire.protocol import same_json

log = logging.getLogger(__name__)

__all__ = ["Attempts", "Rollout", "RolloutRegistry", "RolloutView", "TurnResult", "TurnTrace"]

_FINISHED_KEPT = 100_000  # ids remembered after finishing, to answer late requests clearly
_REPLAYS_KEPT = 8  # answered requests kept per rollout for SDK retries
_ECHO_SEARCHED = 8  # trace entries searched for the turn an echoed assistant message was returned by


@dataclass(frozen=True, slots=True)
class TurnResult:
    message: dict
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: dict | None = None  # OpenAI's choices[].logprobs, when the agent asked for them


@dataclass(frozen=True, slots=True)
class TurnTrace:
    """A gate turn's trace entry while its rollout lives: the messages new to the call, the assistant message
    returned and the finish reason. An idle rollout holds one per turn, and a slotted object is a third of the
    size of a dict; the record gets the dict (`as_dict`), its keys in this order."""

    new_messages: list[dict]
    response: dict
    finish_reason: str

    def as_dict(self) -> dict:
        return {"new_messages": self.new_messages, "response": self.response, "finish_reason": self.finish_reason}


@dataclass(eq=False, slots=True)
class Attempts:
    """One turn's tries: the answer being (or already) generated, whether the agent received it, and the upstream
    calls the turn may still make."""

    budget: AttemptBudget
    future: asyncio.Future | None = None
    delivered: bool = False

    @property
    def succeeded(self) -> bool:
        future = self.future
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    def answers_retry(self, *, sdk_retry: bool) -> bool:
        """Whether a try with the same body is answered from this one instead of being generated anew."""
        future = self.future
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            return False  # nothing to replay: it failed, so the retry generates (within the shared budget)
        return not future.done() or not self.delivered or sdk_retry


def _entry_dict(entry: object) -> dict:
    return entry.as_dict() if isinstance(entry, TurnTrace) else entry  # type: ignore[return-value]


def _scrub(value: object, secrets_: tuple[str, ...]) -> object:
    """`value` with the secrets replaced; the very same object when it holds none (copied only where it changes),
    so a trace shares its messages with the trajectory instead of holding them twice."""
    if isinstance(value, str):
        for secret in secrets_:
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return value
    if isinstance(value, dict):
        changed = {k: s for k, v in value.items() if (s := _scrub(v, secrets_)) is not v}
        return {**value, **changed} if changed else value
    if isinstance(value, list):
        scrubbed = [_scrub(v, secrets_) for v in value]
        return scrubbed if any(s is not v for s, v in zip(scrubbed, value)) else value
    return value


@dataclass(eq=False)
class Rollout:
    id: str
    secret: str = field(repr=False)
    tools_secret: str = field(repr=False)
    mode: str
    sampling: SamplingSettings
    metadata: dict
    trajectory: Trajectory | None  # None in black_box mode
    started_at: float = field(default_factory=time.time)
    status: RolloutStatus = "running"
    answer: object = None
    answered: bool = False
    trace: TraceLog = field(default_factory=TraceLog)  # TurnTrace entries, dicts in black_box mode
    events: list[dict] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    upstream_failures: int = 0
    # per chain (`TurnPlan.chain`; one chain in black_box): its chat calls that failed upstream since its last
    # success. A run that ends with any is failed: a sub-agent lost to the upstream is not the policy's doing, even
    # when the main chain goes on
    chain_failures: dict = field(default_factory=dict)
    last_upstream_error: str = ""
    server_error: str = ""  # a defect of the server's on one of its turns (a 500): the rollout cannot be trusted
    # request fingerprint -> that turn's tries, for SDK retries
    attempts: dict[int, Attempts] = field(default_factory=dict)  # oldest first (an OrderedDict is 3x the size)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while the trajectory is planned or committed
    finishing: bool = False  # its record is being written: it takes no more requests
    stop_rules: tuple = ()  # `interceptor.gate.stop_rules.StopRule`s checked on every sampled tool call
    stopped: StopHit | None = None  # the rule a sampled call matched: no later call is answered
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)  # set with `stopped`, for the driver
    ignored_noted: set = field(default_factory=set)  # unknown request fields already noted in the events
    last_messages: list[dict] = field(default_factory=list)  # black_box trace: what the last call sent
    body_caches: dict[str, BodyCache] = field(default_factory=dict, repr=False)  # per dialect: recent bodies
    last_activity: float = field(default_factory=time.monotonic)  # for idle watchdogs: the last authorised request
    in_flight: int = 0  # chat calls being answered now (a slow CPU generation is not an idle agent)
    tools_in_flight: int = 0  # host-tool calls (`answer`) being answered now
    replies_lost: int = 0  # host-tool replies whose caller had gone by the time they were ready (a slow server)

    def body_cache(self, dialect: str, history_key: str) -> BodyCache:
        cache = self.body_caches.get(dialect)
        if cache is None:
            cache = self.body_caches[dialect] = BodyCache(history_key)
        return cache

    def attempts_for(self, fingerprint: int, new_budget, *, sdk_retry: bool) -> Attempts:
        """The tries of the turn this request belongs to: the earlier ones' when it retries them, else a new
        turn's (a deliberate repeat of a turn that succeeded is a new turn, with a budget of its own)."""
        attempts = self.attempts.get(fingerprint)
        if attempts is not None and attempts.succeeded and not attempts.answers_retry(sdk_retry=sdk_retry):
            del self.attempts[fingerprint]
            attempts = None
        if attempts is None:
            attempts = self.attempts[fingerprint] = Attempts(budget=new_budget())
            while len(self.attempts) > _REPLAYS_KEPT:
                del self.attempts[next(iter(self.attempts))]
        return attempts

    def hold_echo_once(self, returned: dict, echo: dict) -> None:
        """Hold an assistant message's text once. The agent echoes each message it was given in its next request,
        whose conversation the rollout then keeps (the trajectory and the body cache hold the agent's dicts); when
        the echo serialises as the `returned` message did, the trace entry of that turn is pointed at the echo, so
        the trace and the record it becomes are the same JSON."""
        if echo is returned or not same_json(echo, returned):
            return
        for index, entry in self.trace.held_from_last(_ECHO_SEARCHED):
            if isinstance(entry, TurnTrace) and entry.response is returned:
                self.trace.replace(index, replace(entry, response=echo))
                return

    def scrub(self, value: object) -> object:
        """`value` with this rollout's secrets replaced by "[redacted]"."""
        return _scrub(value, (self.secret, self.tools_secret))

    def upstream_failed(self, message: str, chain: object = None) -> None:
        self.upstream_failures += 1
        self.chain_failures[chain] = self.chain_failures.get(chain, 0) + 1
        self.last_upstream_error = message

    def upstream_succeeded(self, chain: object = None) -> None:
        self.chain_failures.pop(chain, None)

    @property
    def trailing_upstream_failures(self) -> int:
        """Chat calls that failed upstream since their chain's last success, over every chain."""
        return sum(self.chain_failures.values())

    def server_failed(self, message: str) -> None:
        self.server_error = self.server_error or message  # the first one: what came after may follow from it

    @property
    def failure(self) -> Failure | None:
        """The failure this rollout would be finished with now: a turn the server failed on (whatever came after:
        what it recorded of that turn cannot be trusted), or its last chat call failed upstream."""
        if self.server_error:
            return Failure(cause="server", message=f"a chat call failed inside the server: {self.server_error}")
        if self.trailing_upstream_failures:
            return Failure(
                cause="upstream",
                message=f"the last {self.trailing_upstream_failures} chat call(s) failed upstream: "
                f"{self.last_upstream_error}",
            )
        return None

    def activity(self) -> float:
        """The time (monotonic) of the agent's last sign of life: now while a chat call is being answered."""
        return time.monotonic() if self.in_flight else self.last_activity

    def note(self, kind: str, **details) -> None:
        self.events.append({"kind": kind, "at": round(time.time(), 3), **details})

    def stop(self, hit: StopHit) -> None:
        """A stop rule matched a sampled call: recorded, and the driver told to stop the agent."""
        self.stopped = hit
        self.note("policy_stop", rule=hit.rule, tool=hit.tool, arguments=hit.arguments[:2000])
        self.stop_requested.set()

    def to_record(
        self,
        *,
        status: RolloutStatus,
        failure: Failure | None,
        reward: float | None,
        journal: Journal | None = None,
    ) -> RolloutRecord:
        """The record; the trace entries kept in `journal` are read back from it. Samples that fail the lineage
        audit (`lineage_audit.py`) make it `failed` with cause `lineage` and no reward, whatever it ended as."""
        read_traces = functools.partial(journal.traces, self.id) if journal is not None else None
        samples = self.trajectory.samples() if self.trajectory else []
        problems = audit_lineage(samples)
        if problems:
            log.error("rollout %s: its samples fail the lineage audit: %s", self.id, "; ".join(problems[:5]))
            self.note("lineage_audit_failed", problems=problems[:20])
            failure = Failure(cause="lineage", message="the samples fail the lineage audit: " + problems[0])
            status, reward = "failed", None
        return RolloutRecord(
            rollout_id=self.id,
            mode=self.mode,
            status=status,
            samples=samples,
            trace=self.trace.entries(read_traces, _entry_dict),
            usage={"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                   "turns": len(self.trace)},
            answer=self.scrub(self.answer),
            reward=reward,
            failure=failure,
            events=self.events,
            metadata=self.metadata,
            started_at=self.started_at,
            finished_at=time.time(),
        )


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode(errors="surrogateescape")).digest()


class RolloutRegistry:
    def __init__(self) -> None:
        self._live: dict[str, Rollout] = {}
        self._finished: OrderedDict[str, tuple[bytes, str]] = OrderedDict()  # id -> (secret digest, status)

    def __len__(self) -> int:
        return len(self._live)

    def create(self, *, mode: str, sampling: SamplingSettings, metadata: dict, trajectory: Trajectory | None) -> Rollout:
        rollout_id = secrets.token_hex(8)
        rollout = Rollout(
            id=rollout_id,
            secret=secrets.token_urlsafe(32),
            tools_secret=secrets.token_urlsafe(32),
            mode=mode,
            sampling=sampling,
            metadata=metadata,
            trajectory=trajectory,
        )
        self._live[rollout_id] = rollout
        return rollout

    def authorize(self, rollout_id: str, authorization: str | None, *, tools: bool = False) -> Rollout:
        """The live rollout whose secret is presented as `Authorization: Bearer <secret>`; with `tools`, its tools
        secret is accepted too."""
        presented = _bearer(authorization)
        rollout = self._live.get(rollout_id)
        if rollout is not None and rollout.finishing:
            raise Conflict(f"rollout {rollout_id} is finishing; it takes no more requests")
        if rollout is not None:
            accepted = [rollout.secret, rollout.tools_secret] if tools else [rollout.secret]
            if presented is None or not any(_same(presented, secret) for secret in accepted):
                raise Unauthorized("invalid API key for this rollout")
            rollout.last_activity = time.monotonic()
            return rollout
        finished = self._finished.get(rollout_id)
        if finished is None:
            raise NotFound(f"no rollout {rollout_id!r}")
        digest, status = finished
        if presented is None or not hmac.compare_digest(_digest(presented), digest):
            raise Unauthorized("invalid API key for this rollout")
        raise Conflict(f"rollout {rollout_id} has finished ({status}); it takes no more requests")

    def get(self, rollout_id: str) -> Rollout:
        rollout = self._live.get(rollout_id)
        if rollout is None:
            raise NotFound(f"no live rollout {rollout_id!r}")
        return rollout

    def live(self) -> list[Rollout]:
        return list(self._live.values())

    def finished_status(self, rollout_id: str) -> str | None:
        finished = self._finished.get(rollout_id)
        return finished[1] if finished else None

    def retire(self, rollout: Rollout, status: RolloutStatus) -> None:
        self._live.pop(rollout.id, None)
        rollout.status = status
        self._finished[rollout.id] = (_digest(rollout.secret), status)
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)

    def is_finished(self, rollout_id: str) -> bool:
        return rollout_id in self._finished


class RolloutView:
    """What a driver (the runner) may read of a live rollout, and `note`: no access to its trajectory or secrets."""

    __slots__ = ("_rollout",)

    def __init__(self, rollout: Rollout) -> None:
        self._rollout = rollout

    @property
    def id(self) -> str:
        return self._rollout.id

    @property
    def answer(self) -> object:
        return self._rollout.answer

    @property
    def answered(self) -> bool:
        return self._rollout.answered

    @property
    def turns(self) -> int:
        return len(self._rollout.trace)

    @property
    def trailing_upstream_failures(self) -> int:
        return self._rollout.trailing_upstream_failures

    @property
    def failure(self) -> Failure | None:
        return self._rollout.failure

    @property
    def replies_lost(self) -> int:
        """The box's host-tool calls this server has not answered in time: answered after their caller had gone,
        or still being answered."""
        return self._rollout.replies_lost + self._rollout.tools_in_flight

    @property
    def stopped(self) -> StopHit | None:
        return self._rollout.stopped

    @property
    def stop_requested(self) -> asyncio.Event:
        return self._rollout.stop_requested

    def activity(self) -> float:
        return self._rollout.activity()

    def note(self, kind: str, **details) -> None:
        self._rollout.note(kind, **details)


def _same(presented: str, secret: str) -> bool:
    # surrogateescape: a header with non-ASCII bytes is compared (and rejected), never an encoding error
    return hmac.compare_digest(presented.encode(errors="surrogateescape"), secret.encode())


def _bearer(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None
