"""One chat turn in `interception_gate` mode: plan the prompt, generate upstream, record, answer.

    request -> a retry of a turn already answered? replay the recorded answer
            -> plan (extend or fork) -> context check -> wait while weights change -> /v1/completions
            -> parse the sampled text -> commit to the trajectory (and the journal) -> the OpenAI assistant message

The agent's answer is derived from the sampled token ids only. A turn is all or nothing: the upstream's reply is
validated before anything is recorded, and a failed generation records nothing (the branch stays as it was) and
marks the rollout with an upstream failure; it never turns into a reward. Planning and committing hold the
rollout's lock. A fork's full render is shared by every rollout that sends the same conversation (a GRPO group's
first turns: `shared_renders.py`), and a large one runs in a worker thread so that it never stalls the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from interceptor.errors import BadRequest, ContextLengthExceeded, UpstreamError
from interceptor.gate.stop_rules import PolicyStopped, StopHit, first_hit
from interceptor.gate.trajectory import TurnPlan
from interceptor.rollouts import Rollout, TurnResult, TurnTrace
from interceptor.store.journal import Journal
from interceptor.store.records import Generation
from interceptor.tokens.rendering import Renderer
from interceptor.tokens.shared_renders import SharedRenders
from interceptor.transport.replicas import ReplicaSet
from interceptor.wire.parsing import parse_output
from interceptor.wire.protocol import ChatRequest
from interceptor.wire.replies import assistant_message, finish_reason_for, new_tool_call_id, token_logprobs

__all__ = ["HEAVY_REQUEST_BYTES", "PARSE_OFF_LOOP_BYTES", "Policy", "run_turn"]

# A request larger than this that forks (renders the whole conversation) is rendered in a worker thread; one
# larger than PARSE_OFF_LOOP_BYTES is also parsed there. Extending a branch renders only the new messages.
HEAVY_REQUEST_BYTES = 16 * 1024
PARSE_OFF_LOOP_BYTES = 1024 * 1024



@dataclass(eq=False, kw_only=True)
class Policy:
    """What the gate needs to generate: the tokenizer side, the upstream, and the policy's state."""

    renderer: Renderer
    upstream: ReplicaSet
    upstream_model: str
    max_model_len: int
    default_max_tokens: int
    version: int = 0  # stamped on every turn; the trainer bumps it after a weight update
    syncs_begun: int = 0  # weight syncs begun (gate pauses): a turn that saw this move may hold two versions
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # cleared while weights change
    journal: Journal | None = None  # committed turns are journaled (a server with a record file)
    observe_turn: Callable[[TurnResult], None] | None = None  # the server's metrics
    renders: SharedRenders = field(init=False)

    def __post_init__(self) -> None:
        self.ready.set()
        self.renders = SharedRenders(self.renderer)


def _sampling(rollout: Rollout, request: ChatRequest, *, max_tokens: int) -> dict:
    pinned = rollout.sampling
    fields = {
        "temperature": pinned.temperature if pinned.temperature is not None else request.temperature,
        "top_p": pinned.top_p if pinned.top_p is not None else request.top_p,
        "top_k": pinned.top_k if pinned.top_k is not None else request.top_k,
        # A rollout's seed makes the rollout reproducible; each turn draws from its own stream (seed + turn number).
        "seed": pinned.seed + len(rollout.trace) if pinned.seed is not None else request.seed,
    }
    return {"max_tokens": max_tokens, **{k: v for k, v in fields.items() if v is not None}}


async def run_turn(
    policy: Policy, rollout: Rollout, request: ChatRequest, *, fingerprint: int, sdk_retry: bool, heavy: bool
) -> TurnResult:
    """One turn. `fingerprint` identifies the request's bytes (`body_cache.py`: retries resend the same body);
    `sdk_retry` is the client's word that this is a retry; `heavy` (a body over HEAVY_REQUEST_BYTES) renders a
    fork off the event loop."""
    assert rollout.trajectory is not None, "run_turn is for interception_gate rollouts"
    if rollout.stopped is not None:
        raise _stopped(rollout.stopped)
    attempts = rollout.attempts_for(fingerprint, policy.upstream.new_budget, sdk_retry=sdk_retry)
    if attempts.answers_retry(sdk_retry=sdk_retry):
        rollout.note("retry_answered_from_record")
        return await asyncio.shield(attempts.future)

    # The answer-to-be is registered before any await, so a retry that arrives meanwhile waits for it.
    future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
    future.add_done_callback(_consume_exception)
    attempts.future, attempts.delivered = future, False
    try:
        plan = await _plan(policy, rollout, request, heavy=heavy)
    except BaseException as exc:
        _settle(future, exc)
        raise
    try:
        sampling = _checked_sampling(policy, rollout, request, plan)
        await policy.ready.wait()  # agents wait, they do not fail, while weights change
        # The version this generation starts on: a weight sync that lands while it runs (vLLM's pause "keep"
        # freezes it and continues it on the new weights) leaves its first tokens from this one, the oldest.
        version, syncs = policy.version, policy.syncs_begun
        generation = await policy.upstream.complete(
            model=policy.upstream_model,
            prompt=plan.prompt,
            sampling=sampling,
            vocab_size=policy.renderer.vocab_size,
            max_model_len=policy.max_model_len,
            top_logprobs=request.top_logprobs,
            budget=attempts.budget,
            rollout_id=rollout.id,
            moved=lambda old, new: rollout.note("replica_moved", replica=old, to=new),
        )
        async with rollout.lock:
            spans_sync = policy.syncs_begun != syncs  # its tail may come from the next version's weights
            result = _record(policy, rollout, plan, generation, request, version=version, spans_sync=spans_sync)
    except BaseException as exc:
        _release(rollout, plan)
        if isinstance(exc, UpstreamError):
            rollout.upstream_failed(exc.message, plan.chain)
            rollout.note("upstream_error", status=exc.status, message=exc.message)
        _settle(future, exc)
        raise
    rollout.upstream_succeeded(plan.chain)
    hit = first_hit(rollout.stop_rules, result.message)
    if hit is not None:  # recorded as sampled; the agent never gets the call
        rollout.stop(hit)
        _settle(future, _stopped(hit))
        raise _stopped(hit)
    future.set_result(result)
    # Readied for the next turn once this answer is out: the fast lane writes it before the loop runs callbacks.
    asyncio.get_running_loop().call_soon(rollout.trajectory.prepare_next, plan.branch, request.tools)
    if policy.observe_turn is not None:
        policy.observe_turn(result)
    return result


async def _plan(policy: Policy, rollout: Rollout, request: ChatRequest, *, heavy: bool) -> TurnPlan:
    """Reserve the turn: extend the branch the messages continue, or fork (a whole render, off the event loop
    for a large request). The trajectory changes only under the rollout's lock."""
    trajectory = rollout.trajectory
    async with rollout.lock:
        plan, reason = trajectory.extend(request.messages, request.tools, request.tools_key, request.carried,
                                         request.request_kind)
        if request.request_kind not in (None, "turn", "subagent"):  # a sub-agent's turns are turns
            rollout.note("side_request", request_kind=request.request_kind, extended=plan is not None)
            reason = f"{request.request_kind} request" + (f" ({reason})" if reason else "")
        if plan is None:
            prompt = await policy.renders.render_full(request.messages, request.tools, request.tools_key, off_loop=heavy)
            plan = trajectory.fork(request.messages, request.tools_key, prompt, reason=reason,
                                   request_kind=request.request_kind)
    return plan


def _checked_sampling(policy: Policy, rollout: Rollout, request: ChatRequest, plan: TurnPlan) -> dict:
    """The upstream's sampling fields, or `ContextLengthExceeded` when the prompt leaves no room."""
    wanted = rollout.sampling.max_tokens or request.max_tokens
    prompt_len = plan.prompt_len
    room = policy.max_model_len - prompt_len
    if wanted is not None and request.max_tokens_is_cap and room >= 1:
        wanted = min(wanted, room)
    if room < 1 or (wanted is not None and wanted > room):
        rollout.note("context_length_exceeded", prompt_tokens=prompt_len, max_tokens=wanted)
        error = ContextLengthExceeded(
            f"This model's maximum context length is {policy.max_model_len} tokens. However, you requested "
            f"{prompt_len + (wanted or 0)} tokens ({prompt_len} in the messages, {wanted or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="messages",
        )
        error.prompt_tokens, error.limit = prompt_len, policy.max_model_len
        raise error
    sampling = _sampling(rollout, request, max_tokens=wanted or min(policy.default_max_tokens, room))
    stop_ids = _stop_ids(policy.renderer, request)
    if stop_ids:
        sampling["stop_token_ids"] = stop_ids
    return sampling


def _settle(future: asyncio.Future, exc: BaseException) -> None:
    if isinstance(exc, Exception):
        future.set_exception(exc)
    else:
        future.cancel()


_pending_releases: set[asyncio.Task] = set()


def _release(rollout: Rollout, plan: TurnPlan) -> None:
    """Give the planned turn back. The trajectory changes only under the rollout's lock: while a large request
    is being planned in a thread, the release waits for it."""
    if not rollout.lock.locked():
        rollout.trajectory.release(plan)
        return

    async def release_when_free() -> None:
        async with rollout.lock:
            rollout.trajectory.release(plan)

    task = asyncio.get_running_loop().create_task(release_when_free())
    _pending_releases.add(task)
    task.add_done_callback(_pending_releases.discard)


def _stop_ids(renderer: Renderer, request: ChatRequest) -> list[int]:
    """`parallel_tool_calls: false` is honoured by ending the turn at the first call's closing tag (the template
    closes the turn after it, as after a turn cut by length)."""
    if request.parallel_tool_calls or not request.tools or request.tool_choice == "none":
        return []
    close = renderer.single_token_id("</tool_call>")
    if close is None:
        raise BadRequest(
            "parallel_tool_calls: false is not supported with this model's tokenizer (</tool_call> is not one token)",
            param="parallel_tool_calls",
        )
    return [close, renderer.end_of_turn_id]


def _record(
    policy: Policy, rollout: Rollout, plan: TurnPlan, generation: Generation, request: ChatRequest, *, version: int,
    spans_sync: bool,
) -> TurnResult:
    text = policy.renderer.decode(generation.token_ids)
    parsed = parse_output(text, tools=request.tools, calls_allowed=bool(request.tools) and request.tool_choice != "none")
    message = assistant_message(parsed, [new_tool_call_id() for _ in parsed.calls])
    finish_reason = finish_reason_for(message, generation.finish_reason)
    known = plan.branch.covered  # messages the branch already covered, before this turn is committed
    if known:  # the agent's copy of the branch's last answer is in this request: keep that one only
        rollout.hold_echo_once(plan.branch.answer, request.messages[known - 1])
    delta = rollout.trajectory.commit(
        plan,
        generation,
        returned=message,
        finish_reason=finish_reason,
        malformed=parsed.malformed,
        policy_version=version,
        spans_sync=spans_sync,
    )
    entry = rollout.scrub(
        {"new_messages": request.messages[known:], "response": message, "finish_reason": finish_reason}
    )
    index = rollout.trace.append(TurnTrace(**entry))
    rollout.prompt_tokens += plan.prompt_len
    rollout.completion_tokens += len(generation.token_ids)
    if policy.journal is not None:  # the journal holds the entry now: keep only where it lies
        usage = (rollout.prompt_tokens, rollout.completion_tokens)
        rollout.trace.spill(index, policy.journal.turn(rollout.id, branch=delta, trace=entry, usage=usage))
    logprobs = None
    if request.logprobs:
        tokens = [policy.renderer.decode_one(t) for t in generation.token_ids]
        logprobs = token_logprobs(tokens, generation.logprobs, generation.top_logprobs)
    return TurnResult(
        message=message,
        finish_reason=finish_reason,
        prompt_tokens=plan.prompt_len,
        completion_tokens=len(generation.token_ids),
        logprobs=logprobs,
    )


def _stopped(hit: StopHit) -> PolicyStopped:
    return PolicyStopped(f"the rollout was stopped by rule {hit.rule!r}: its call to {hit.tool} is not run")


def _consume_exception(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a failed turn nobody retried is not an "exception never retrieved"
