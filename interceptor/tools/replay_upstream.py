"""A policy server that answers from a recorded rollout: vLLM's `/v1/completions` contract, no model.

Each request's prompt (token ids, as the interception gate rendered the agent's request) is matched to a recorded
turn whose prompt it equals, and answered with the tokens and logprobs that turn sampled (the gate then parses and
streams them in the agent's dialect, as it did when the rollout was recorded). A prompt equal token for token is an
exact match. Otherwise both prompts are decoded and compared after `Normaliser` has replaced what changes from one
run to the next by itself (dates, sandbox directories, the host's OS version, Codex's chunk ids and wall times):
equal then is a match, marked `normalised`. Anything else is a divergence: answered with a 400 saying so, and
reported with where the texts part (the system prompt, the tools, or which message) and both sides around that point.

    async with ReplayUpstream(record, tokenizer) as upstream:   # upstream.url is the policy server's URL
        ...                                                    # upstream.outcomes: one per request, in order
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from interceptor.store.records import RolloutRecord

__all__ = ["Divergence", "Normaliser", "Outcome", "RecordedTurn", "ReplayUpstream", "recorded_turns"]

_SNIPPET = 80
_DEFAULT_VOLATILE = (
    (r"\b\d{4}-\d{2}-\d{2}\b", "<date>"),
    (r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{1,2} \d{4}\b",
     "<date>"),
    # a sandbox's directory: tempfile's 8 random characters (Claude Code writes its "_" as "-" in a project path),
    # under the namespace backend's root or directly in the temp directory (LocalSandbox, where bwrap is missing)
    (r"(?:interceptor-sandboxes[/-])?interceptor-rollout-[A-Za-z0-9_-]{8}", "interceptor-rollout-<id>"),
    # the host's kernel, as Claude Code states it ("OS Version: Linux 6.18.44-..."): a replay on another machine
    (r"OS Version: [^\n]*", "OS Version: <os>"),
    (r"Chunk ID: [0-9a-f]+", "Chunk ID: <id>"),
    (r"Wall time: [0-9.]+ seconds", "Wall time: <t> seconds"),
)


@dataclass(frozen=True, slots=True)
class Normaliser:
    """Regular expressions and their replacements, applied in order to both sides before they are compared."""

    patterns: tuple[tuple[str, str], ...] = _DEFAULT_VOLATILE

    def __call__(self, text: str) -> str:
        for pattern, replacement in self.patterns:
            text = re.sub(pattern, replacement, text)
        return text

    def differences(self, a: str, b: str) -> tuple[str, ...]:
        """The replacements under which `a` and `b` hold different values (what normalising hid)."""
        return tuple(replacement for pattern, replacement in self.patterns
                     if re.findall(pattern, a) != re.findall(pattern, b))


@dataclass(frozen=True, slots=True)
class RecordedTurn:
    sample: int
    turn: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # vLLM's: stop | length


@dataclass(frozen=True, slots=True)
class Divergence:
    where: str  # "the system prompt", "the tools", "message 3 (user)", "an extra request", ...
    at_char: int  # in the normalised texts
    recorded: str  # the recorded prompt around that point
    replayed: str  # the new prompt around that point
    closest: tuple[int, int] | None  # (sample, turn) of the recorded prompt it was compared with

    def describe(self) -> str:
        if self.closest is None:
            return f"{self.where}"
        return (f"{self.where} differs at character {self.at_char} (compared with sample {self.closest[0]} turn "
                f"{self.closest[1]}):\n  recorded: {self.recorded!r}\n  replayed: {self.replayed!r}")


@dataclass(frozen=True, slots=True)
class Outcome:
    request: int  # 1-based, in the order the requests came
    matched: tuple[int, int] | None  # (sample, turn) answered
    normalised: bool  # matched only after normalising
    divergence: Divergence | None
    volatile: tuple[str, ...] = ()  # for a normalised match: what differed (e.g. "<date>")


def recorded_turns(record: RolloutRecord) -> list[RecordedTurn]:
    turns = []
    for sample in record.samples:
        for number, turn in enumerate(sample.turns):
            turns.append(RecordedTurn(
                sample=sample.index, turn=number, prompt_ids=sample.input_ids[:turn.completion_start],
                token_ids=sample.input_ids[turn.completion_start:turn.completion_end],
                logprobs=sample.old_logprobs[turn.completion_start:turn.completion_end],
                finish_reason="length" if turn.finish_reason == "length" else "stop",
            ))
    return turns


def _where(text: str, at: int) -> str:
    """Which part of a ChatML-rendered prompt the character `at` falls in."""
    starts = [m.start() for m in re.finditer(r"<\|im_start\|>", text)]
    if not starts:
        return "the prompt"
    index = max((i for i, start in enumerate(starts) if start <= at), default=0)
    segment_end = starts[index + 1] if index + 1 < len(starts) else len(text)
    segment = text[starts[index]:segment_end]
    role = segment[len("<|im_start|>"):].split("\n", 1)[0] or "?"
    if role == "system":
        block = segment.rfind("<tools>")  # the block itself; the template's own text names the tag before it
        tools = segment.find("# Tools") if "# Tools" in segment else block
        tools_end = segment.find("</tools>", block) if block >= 0 else -1
        offset = at - starts[index]
        if tools >= 0 and tools <= offset <= (tools_end if tools_end >= 0 else len(segment)):
            return "the tools"
        return "the system prompt"
    kind = "a tool result" if segment.lstrip().find("<tool_response>") >= 0 and role == "user" else role
    return f"message {index + 1} ({kind})"


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class ReplayUpstream:
    record: RolloutRecord
    tokenizer: object  # a transformers tokenizer: decodes prompts for the normalised comparison
    max_model_len: int = 32768
    model: str = "replay"
    normaliser: Normaliser = field(default_factory=Normaliser)
    outcomes: list[Outcome] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self.turns = recorded_turns(self.record)
        self._used: set[int] = set()
        self._texts: dict[int, str] = {}
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> ReplayUpstream:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def first_divergence(self) -> Divergence | None:
        return next((o.divergence for o in self.outcomes if o.divergence is not None), None)

    @property
    def unused(self) -> list[RecordedTurn]:
        return [turn for i, turn in enumerate(self.turns) if i not in self._used]

    def _text(self, i: int) -> str:
        if i not in self._texts:
            self._texts[i] = self.normaliser(self._decode(self.turns[i].prompt_ids))
        return self._texts[i]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def match(self, prompt: list[int]) -> Outcome:
        """The outcome of one request: the recorded turn it matches, or where it diverges."""
        number = len(self.outcomes) + 1
        free = [i for i in range(len(self.turns)) if i not in self._used]
        exact = next((i for i in free if self.turns[i].prompt_ids == prompt), None)
        if exact is not None:
            return self._take(Outcome(number, self._key(exact), False, None), exact)
        text = self.normaliser(self._decode(prompt))
        same = next((i for i in free if self._text(i) == text), None)
        if same is not None:
            volatile = self.normaliser.differences(self._decode(self.turns[same].prompt_ids), self._decode(prompt))
            return self._take(Outcome(number, self._key(same), True, None, volatile), same)
        if not free:
            where = f"an extra request: the recording has {len(self.turns)} chat call(s), all answered"
            return self._take(Outcome(number, None, False, Divergence(where, 0, "", text[-_SNIPPET:], None)), None)
        closest = max(free, key=lambda i: (_common_prefix(self._text(i), text), -i))
        recorded = self._text(closest)
        at = _common_prefix(recorded, text)
        where = _where(recorded, at) if at < len(recorded) else _where(text, at)
        if at == len(recorded):
            where = f"{where}: the new prompt goes on where the recorded one ended"
        divergence = Divergence(where, at, recorded[max(0, at - 20):at + _SNIPPET], text[max(0, at - 20):at + _SNIPPET],
                                self._key(closest))
        return self._take(Outcome(number, None, False, divergence), None)

    def _key(self, i: int) -> tuple[int, int]:
        return self.turns[i].sample, self.turns[i].turn

    def _take(self, outcome: Outcome, i: int | None) -> Outcome:
        if i is not None:
            self._used.add(i)
        self.outcomes.append(outcome)
        return outcome

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "max_model_len": self.max_model_len}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _completions(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return web.json_response({"error": {"message": "replay answers token-id prompts only"}}, status=400)
        outcome = self.match(prompt)
        if outcome.divergence is not None:
            message = f"the replay diverged from the recording at request {outcome.request}: " \
                      f"{outcome.divergence.describe()}"
            return web.json_response({"error": {"message": message, "type": "replay_diverged"}}, status=400)
        turn = next(t for t in self.turns if (t.sample, t.turn) == outcome.matched)
        choice = {
            "index": 0, "text": self._decode(turn.token_ids), "token_ids": turn.token_ids, "prompt_token_ids": prompt,
            "logprobs": {"token_logprobs": turn.logprobs, "tokens": [], "text_offset": [], "top_logprobs": []},
            "finish_reason": turn.finish_reason, "stop_reason": None,
        }
        return web.json_response({
            "id": f"cmpl-replay-{outcome.request}", "object": "text_completion", "model": self.model,
            "choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(turn.token_ids)},
        })
