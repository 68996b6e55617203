"""Messages to prompt token ids with the model's own tokenizer and chat template, and sampled ids back to text.

Two ways to render:
- `render_full(messages, tools)`: the whole conversation plus the generation prompt (a new sample, a fork;
  `render_full_json` gives those ids as JSON);
- `render_suffix(last_assistant, new_messages, tools)`: only what follows an assistant turn the model sampled.
  The template is rendered on a small context (system, a placeholder user turn, that assistant turn) followed by
  the new messages; what comes after that assistant turn's end-of-turn token is the suffix. Its cost does not
  depend on how long the conversation already is. For the Qwen templates whose text says how, the suffix is
  written without running the template (`suffix_writer.py`: checked when the template loads, audited while
  serving); `rendered_suffix` is the template's own.

Text is split at special tokens before BPE, so ids of a suffix that starts right after a special token are the
ids a full tokenization would give there; for the same reason a long text, and a whole conversation of 2k+
characters, is encoded as chunks cut after each end-of-turn token: the ids of long chunks are remembered across
rollouts (an agent's system prompt and tools), the others encoded in one batch call without the GIL. ASCII text
goes to the tokenizer's tiktoken twin where it has one (`bpe_twin.py`).

Speed (`bench/bench_gate.py`): the template is rendered through transformers' own compiled template (its sandbox,
filters and globals) without `render_jinja_template`'s defensive deep copy, which is for callers that pass rich
objects; the messages and tools here are plain JSON from `orjson`, normalised once. Its `tojson` is memoised on
the identity of the value, so the tool list a rollout resends (the same parsed objects, `body_cache.py`) is
serialised once, not twice per turn. The sandbox's attribute checks on plain JSON values and jinja's loop and
namespace objects are answered at once (`_plain_data_getattr`), and short texts are encoded without offsets.
`tests/interceptor/test_rendering_fast_path.py` holds the fast path to the same text as `render_jinja_template`.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import BuiltinMethodType, MethodType

from jinja2.runtime import LoopContext, new_context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from jinja2.utils import Namespace
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template

from interceptor.errors import BadRequest, ConfigError
from interceptor.tokens.bpe_twin import build_twin
from interceptor.tokens.chunk_ids import ChunkIds, cut_after
from interceptor.tokens.ids_json import IdsJson
from interceptor.tokens.suffix_writer import AUDIT_EVERY, chatml_suffix, checked_writer
from interceptor.tokens.templates import training_template_for

__all__ = ["Renderer", "RendererConfig"]

log = logging.getLogger("interceptor.tokens.rendering")

_PLACEHOLDER_USER = {"role": "user", "content": "."}
_LONG_TEXT_CHARS = 16 * 1024  # longer texts are encoded as chunks in one batch call, which releases the GIL
_MISSING = object()
_TOJSON_MEMO = 4096  # values whose JSON the template's tojson remembers (the tools of the live rollouts)


def _model_vocab_size(model_dir: Path) -> int:
    """The model's own vocabulary size (config.json), which may exceed the tokenizer's (padded embeddings)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    size = config.get("vocab_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) else 0


@dataclass(frozen=True, kw_only=True)
class RendererConfig:
    model_dir: Path
    chat_template: str | None = None  # overrides the model's template (text, not a path)
    training_template: bool = False  # use TRL's prefix-preserving variant of the model's template when known
    tiktoken_twin: bool = True  # encode ASCII text with tiktoken where it gives the tokenizer's ids (bpe_twin.py)
    suffix_writer: bool = True  # write a steady turn's suffix without the template where it says how (suffix_writer.py)

    def __post_init__(self) -> None:
        if not Path(self.model_dir).is_dir():
            raise ConfigError(f"model directory {self.model_dir} does not exist")


class Renderer:
    def __init__(self, config: RendererConfig) -> None:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(config.model_dir))
        template = config.chat_template or tokenizer.chat_template
        if not template:
            raise ConfigError(f"{config.model_dir} has no chat template; pass one in the configuration")
        if config.training_template:
            template = training_template_for(template) or template
        self.tokenizer = tokenizer
        self.template = template
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ConfigError(f"{config.model_dir}'s tokenizer has no eos token (the end-of-turn token)")
        self.end_of_turn_id: int = eos
        self.end_of_turn_text: str = tokenizer.convert_ids_to_tokens(eos)
        self._special_kwargs = {
            "bos_token": tokenizer.bos_token or "",
            "eos_token": tokenizer.eos_token or "",
        }
        # Ids the model may sample: its embedding can be larger than the tokenizer (padded vocabularies).
        self.vocab_size: int = max(len(tokenizer), _model_vocab_size(Path(config.model_dir)))
        self._single_ids: dict[str, int | None] = {}
        self._compiled = _fast_template(template)
        # The template's globals as a plain dict: jinja's own `render` iterates their ChainMap twice per call
        self._globals = dict(self._compiled.globals) if self._compiled is not None else {}
        # The Rust tokenizer itself: `tokenizer.encode` adds Python work around the same call
        self._rust = getattr(tokenizer, "_tokenizer", None)
        rust = self._rust
        self._encode_fast = getattr(rust, "encode_batch_fast", None) or getattr(rust, "encode_batch", None)
        self._chunks = ChunkIds()
        self._decode_direct = rust is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self.twin, self.twin_absent_because = (
            build_twin(tokenizer, config.model_dir) if config.tiktoken_twin and rust is not None
            else (None, "not asked for" if rust is not None else "the tokenizer is not a fast (Rust) tokenizer")
        )
        # A steady turn's suffix written without the template, where the template is one that says how
        self.suffix_writer, self.suffix_writer_absent_because = (
            checked_writer(template, self.end_of_turn_text, self.rendered_suffix) if config.suffix_writer
            else (None, "not asked for"))
        self.suffix_mismatches = 0
        self._suffixes_written = 0

    def single_token_id(self, text: str) -> int | None:
        """The id of `text` when the tokenizer encodes it as one token, else None."""
        if text not in self._single_ids:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            self._single_ids[text] = ids[0] if len(ids) == 1 else None
        return self._single_ids[text]

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_text(self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool) -> str:
        template = self._compiled
        if template is not None:
            variables = {
                **self._globals, **self._special_kwargs, "messages": chat_template_utils._alias_reasoning_fields(messages),
                "tools": tools, "documents": None, "add_generation_prompt": generation_prompt,
            }
            # What `Template.render` does, with the globals already in `variables` (a shared context)
            context = new_context(template.environment, template.name, template.blocks, variables, True, self._globals)
            try:
                return template.environment.concat(template.root_render_func(context))
            except Exception as exc:  # raise_exception in the template, or a type error on odd input
                raise BadRequest(f"the chat template rejected these messages: {exc}") from exc
        return self.render_text_reference(messages, tools, generation_prompt=generation_prompt)

    def render_text_reference(self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool) -> str:
        """The text as transformers' `render_jinja_template` renders it (the fast path's reference)."""
        try:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=self.template,
                add_generation_prompt=generation_prompt,
                **self._special_kwargs,
            )
        except Exception as exc:  # jinja raises template-defined errors (raise_exception) for input it rejects
            raise BadRequest(f"the chat template rejected these messages: {exc}") from exc
        return rendered[0]

    def encode(self, text: str, *, shared: bool = False) -> list[int]:
        """The ids of `text`. `shared`: a whole conversation, whose long chunks (an agent's system prompt and tools,
        a group's task) other rollouts send too, so their ids are remembered (`chunk_ids.py`)."""
        rust = self._rust
        if rust is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        if len(text) <= _LONG_TEXT_CHARS and not (shared and len(text) >= self._chunks.min_chars):
            if self.twin is not None and (ids := self.twin.encode(text)) is not None:
                return ids
            return self._encode_batch([text])[0]
        # Cut right after each end-of-turn token, the chunks give the ids the whole text gives (special tokens are
        # split off before BPE); the ones not remembered are encoded in one batch call, which releases the GIL.
        chunks = cut_after(text, self.end_of_turn_text)
        return self._chunks.encode(chunks, self._encode_batch)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text: the twin's where it answers (ASCII), the others without offsets (`encode_batch_fast`:
        the same ids, a third less work for a short text) in one call on the tokenizer's threads without the GIL."""
        twin = self.twin
        out: list[list[int] | None] = [twin.encode(t) for t in texts] if twin is not None else [None] * len(texts)
        rest = [i for i, ids in enumerate(out) if ids is None]
        if rest:
            for i, encoding in zip(rest, self._encode_fast([texts[i] for i in rest], add_special_tokens=False)):
                out[i] = encoding.ids
        return out  # type: ignore[return-value]

    def render_full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render_text(messages, tools, generation_prompt=True), shared=True)

    def render_full_json(self, messages: list[dict], tools: list[dict] | None) -> IdsJson:
        """`render_full`'s ids as JSON; a long text's made chunk by chunk, with no list of every id (`ids_json.py`)."""
        text = self.render_text(messages, tools, generation_prompt=True)
        if self._rust is None or len(text) <= _LONG_TEXT_CHARS:
            return IdsJson.of(self.encode(text, shared=True))
        return self._chunks.encode_json(cut_after(text, self.end_of_turn_text), self._encode_batch)

    def closing_turns(self, *, system: dict | None, last_assistant: dict, tools: list[dict] | None) -> int:
        """How many end-of-turn tokens the template renders up to and including `last_assistant`'s, in the small
        context `render_suffix` renders it in. It depends only on these three, so the gate works it out for the
        message it returned once the answer is out (`Trajectory.prepare_next`), off the next turn's path."""
        context = ([system] if system else []) + [_PLACEHOLDER_USER, last_assistant]
        return self.render_text(context, tools, generation_prompt=False).count(self.end_of_turn_text)

    @property
    def writes_suffixes(self) -> bool:
        """Whether steady turns' suffixes are written without the template (then `closing_turns` is needed only
        for new messages the writer declines, and need not be readied ahead)."""
        return self.suffix_writer is not None

    def render_suffix(
        self, *, system: dict | None, last_assistant: dict, new_messages: list[dict], tools: list[dict] | None,
        closing_turns: int | None = None,
    ) -> list[int] | None:
        """Ids that follow `last_assistant`'s end-of-turn token: the template's separator, the new messages and
        the generation prompt. None when the template renders no end-of-turn token for that turn.
        `closing_turns`: `self.closing_turns(...)` of these same arguments, when the caller has it already.

        How the template would re-render the assistant turn itself (Qwen3 drops earlier reasoning) does not
        matter: the recorded sample keeps the ids the model sampled, and the suffix starts after them.
        """
        text = chatml_suffix(new_messages) if self.suffix_writer is not None else None
        if text is None:
            text = self.rendered_suffix(system=system, last_assistant=last_assistant, new_messages=new_messages,
                                        tools=tools, closing_turns=closing_turns)
        else:
            self._suffixes_written += 1
            if self._suffixes_written % AUDIT_EVERY == 0:
                reference = self.rendered_suffix(system=system, last_assistant=last_assistant,
                                                 new_messages=new_messages, tools=tools)
                if reference != text:
                    self._writer_off(text, reference)
                    text = reference
        return None if text is None else self.encode(text)

    def rendered_suffix(
        self, *, system: dict | None, last_assistant: dict, new_messages: list[dict], tools: list[dict] | None,
        closing_turns: int | None = None,
    ) -> str | None:
        """The suffix's text as the template renders it: a small context (system, a placeholder user turn,
        `last_assistant`) and the new messages, cut after that assistant turn's end-of-turn token."""
        if closing_turns is None:
            closing_turns = self.closing_turns(system=system, last_assistant=last_assistant, tools=tools)
        if closing_turns == 0:
            return None
        context = ([system] if system else []) + [_PLACEHOLDER_USER, last_assistant]
        after = self.render_text(context + new_messages, tools, generation_prompt=True)
        end = -1
        for _ in range(closing_turns):
            end = after.find(self.end_of_turn_text, end + 1)
            if end < 0:
                return None
        return after[end + len(self.end_of_turn_text):]

    def _writer_off(self, text: str, reference: str | None) -> None:
        self.suffix_mismatches += 1
        if self.suffix_writer is None:
            return
        self.suffix_writer = None
        self.suffix_writer_absent_because = "a written suffix differed from the template's while serving"
        log.error(
            "a written suffix (%d characters) differed from the chat template's (%s); suffixes are rendered "
            "through the template for the rest of this process", len(text),
            "no end-of-turn token" if reference is None else f"{len(reference)} characters",
        )

    def decode(self, ids: list[int]) -> str:
        if self.twin is not None and (text := self.twin.decode(ids)) is not None:
            return text  # tiktoken's bytes: the same text where build_twin checked it (audited), a third of the work
        if self._decode_direct:  # what `tokenizer.decode` does when it cleans nothing up, without its Python layers
            return self._rust.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _fast_template(template: str):
    """Transformers' compiled template in an overlay environment whose `tojson` is memoised, or None when this
    transformers lacks the pieces (then `render_jinja_template` is used)."""
    compile_ = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_ is None or not hasattr(chat_template_utils, "_alias_reasoning_fields"):
        return None
    environment = compile_(template).environment.overlay()
    environment.filters = {**environment.filters, "tojson": _MemoJson(environment.filters["tojson"])}
    if _known_sandbox(environment):
        environment.getattr = _plain_data_getattr(environment.getattr, environment.undefined)
    return environment.from_string(template)


_DICT_ATTRIBUTES = frozenset(dir(dict))
_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {"format", "format_map"}
_RUNTIME_OBJECTS = (LoopContext, Namespace)  # `loop.index0`, `ns.last_query_index` (transformers subclasses Namespace)


def _known_sandbox(environment) -> bool:
    """Whether `environment` checks attributes as jinja's ImmutableSandboxedEnvironment does (transformers' own)."""
    kind = type(environment)
    return (isinstance(environment, ImmutableSandboxedEnvironment)
            and kind.getattr is SandboxedEnvironment.getattr
            and kind.is_safe_attribute is ImmutableSandboxedEnvironment.is_safe_attribute
            and kind.wrap_str_format is SandboxedEnvironment.wrap_str_format)


def _plain_data_getattr(sandboxed, undefined):
    """The sandbox's `getattr`, with the answer it would give given at once for what a chat template reads:
    - `message.role` on a dict: a dict has no such attribute, so the sandbox tries it, catches the AttributeError
      and takes the item; here the item is taken (a dict's own attributes, `items` and the like, are not);
    - a public `str` method other than `format`: the sandbox's checks pass it (a str is immutable, not internal);
    - a public attribute of jinja's loop and namespace objects (and their subclasses) that is not a method:
      likewise (neither is a mutable container, a function or a type), and only a method can be the `str.format`
      the sandbox wraps.
    Everything else goes through the sandbox's checks. Those checks were two thirds of a small render; the fast
    path gives the reference render's text for every template TRL ships (test_rendering_fast_path.py)."""

    def getattr_(obj, attribute):
        kind = type(obj)
        if kind is dict:
            if attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return undefined(obj=obj, name=attribute)
        elif kind is str:
            if attribute in _STR_METHODS:
                return getattr(obj, attribute)
        elif isinstance(obj, _RUNTIME_OBJECTS) and not attribute.startswith("_"):
            value = getattr(obj, attribute, _MISSING)
            if value is not _MISSING and not isinstance(value, (MethodType, BuiltinMethodType)):
                return value
        return sandboxed(obj, attribute)

    return getattr_


class _MemoJson:
    """A `tojson` filter that remembers the JSON of dicts and lists by identity, holding each value so that its
    id stays its own. Values here are never mutated: parsed once, normalised into new objects."""

    def __init__(self, tojson) -> None:
        self._tojson = tojson
        self._memo: OrderedDict[tuple, tuple[object, str]] = OrderedDict()

    def __call__(self, value, *args, **kwargs) -> str:
        if not isinstance(value, (dict, list)):
            return self._tojson(value, *args, **kwargs)
        key = (id(value), args, tuple(sorted(kwargs.items())))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        text = self._tojson(value, *args, **kwargs)
        self._memo[key] = (value, text)
        if len(self._memo) > _TOJSON_MEMO:
            self._memo.popitem(last=False)
        return text
