"""One chat turn in `interception_gate` mode: plan the prompt, generate upstream, record, answer.

    request -> retry? replay the recorded answer
            -> plan (extend or fork) -> context check -> wait while weights change -> /v1/completions
            -> parse the sampled text -> commit to the trajectory -> the OpenAI assistant message

The agent's answer is derived from the sampled token ids only. A failed generation records nothing (the branch
stays as it was) and marks the rollout with an upstream failure; it never turns into a reward.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .errors import ContextLengthExceeded, UpstreamError
from .parsing import parse_output
from .protocol import ChatRequest, assistant_message, finish_reason_for, new_tool_call_id
from .rendering import Renderer
from .rollouts import Rollout, TurnResult
from .trajectory import Generation, TurnPlan
from .upstream import UpstreamClient

__all__ = ["Policy", "run_turn"]


@dataclass(eq=False, kw_only=True)
class Policy:
    """What the gate needs to generate: the tokenizer side, the upstream, and the policy's state."""

    renderer: Renderer
    upstream: UpstreamClient
    upstream_model: str
    max_model_len: int
    default_max_tokens: int
    version: int = 0  # stamped on every turn; the trainer bumps it after a weight update
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # cleared while weights change

    def __post_init__(self) -> None:
        self.ready.set()


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


async def run_turn(policy: Policy, rollout: Rollout, request: ChatRequest, *, fingerprint: int) -> TurnResult:
    """One turn. `fingerprint` identifies the request (a hash of its body): SDK retries resend the same body."""
    trajectory = rollout.trajectory
    assert trajectory is not None, "run_turn is for interception_gate rollouts"
    earlier = rollout.replays.get(fingerprint)
    if earlier is not None and (not earlier.done() or (not earlier.cancelled() and earlier.exception() is None)):
        rollout.note("retry_answered_from_record")
        return await asyncio.shield(earlier)

    plan = trajectory.plan(request.messages, request.tools)
    wanted = rollout.sampling.max_tokens or request.max_tokens
    prompt_len = len(plan.prompt_ids)
    room = policy.max_model_len - prompt_len
    if room < 1 or (wanted is not None and wanted > room):
        trajectory.release(plan)
        rollout.note("context_length_exceeded", prompt_tokens=prompt_len, max_tokens=wanted)
        raise ContextLengthExceeded(
            f"This model's maximum context length is {policy.max_model_len} tokens. However, you requested "
            f"{prompt_len + (wanted or 0)} tokens ({prompt_len} in the messages, {wanted or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="messages",
        )
    max_tokens = wanted or min(policy.default_max_tokens, room)

    future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
    future.add_done_callback(_consume_exception)
    rollout.remember_replay(fingerprint, future)
    try:
        await policy.ready.wait()  # agents wait, they do not fail, while weights change
        generation = await policy.upstream.complete(
            model=policy.upstream_model,
            prompt_ids=plan.prompt_ids,
            sampling=_sampling(rollout, request, max_tokens=max_tokens),
        )
        result = _record(policy, rollout, plan, generation, request)
    except BaseException as exc:
        trajectory.release(plan)
        if isinstance(exc, UpstreamError):
            rollout.upstream_failures += 1
            rollout.trailing_upstream_failures += 1
            rollout.note("upstream_error", status=exc.status, message=exc.message)
        if isinstance(exc, Exception):
            future.set_exception(exc)
        else:
            future.cancel()
        raise
    rollout.trailing_upstream_failures = 0
    future.set_result(result)
    return result


def _record(policy: Policy, rollout: Rollout, plan: TurnPlan, generation: Generation, request: ChatRequest) -> TurnResult:
    text = policy.renderer.decode(generation.token_ids)
    parsed = parse_output(text, tools=request.tools)
    message = assistant_message(parsed, [new_tool_call_id() for _ in parsed.calls])
    finish_reason = finish_reason_for(message, generation.finish_reason)
    known = len(plan.branch.messages)  # messages the branch already covered, before this turn is committed
    rollout.trajectory.commit(
        plan,
        generation,
        returned=message,
        finish_reason=finish_reason,
        malformed=parsed.malformed,
        policy_version=policy.version,
    )
    rollout.trace.append(
        {"new_messages": request.messages[known:], "response": message, "finish_reason": finish_reason}
    )
    rollout.prompt_tokens += len(plan.prompt_ids)
    rollout.completion_tokens += len(generation.token_ids)
    return TurnResult(
        message=message,
        finish_reason=finish_reason,
        prompt_tokens=len(plan.prompt_ids),
        completion_tokens=len(generation.token_ids),
    )


def _consume_exception(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a failed turn nobody retried is not an "exception never retrieved"
