"""Messages to prompt token ids with the model's own tokenizer and chat template, and sampled ids back to text.

Two ways to render:
- `render_full(messages, tools)`: the whole conversation plus the generation prompt (a new sample, a fork);
- `render_suffix(last_assistant, new_messages, tools)`: only what follows an assistant turn the model sampled.
  The template is rendered on a small context (system, a placeholder user turn, that assistant turn) followed by
  the new messages; what comes after that assistant turn's end-of-turn token is the suffix. Its cost does not
  depend on how long the conversation already is.

Text is split at special tokens before BPE, so ids of a suffix that starts right after a special token are the
ids a full tokenization would give there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

from .errors import BadRequest, ConfigError
from .templates import training_template_for

__all__ = ["Renderer", "RendererConfig"]

_PLACEHOLDER_USER = {"role": "user", "content": "."}
_LONG_TEXT_CHARS = 64 * 1024  # longer texts are tokenized through the batch path, which releases the GIL


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

    def single_token_id(self, text: str) -> int | None:
        """The id of `text` when the tokenizer encodes it as one token, else None."""
        if text not in self._single_ids:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            self._single_ids[text] = ids[0] if len(ids) == 1 else None
        return self._single_ids[text]

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_text(self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool) -> str:
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

    def encode(self, text: str) -> list[int]:
        if len(text) > _LONG_TEXT_CHARS:
            # The batch path of a fast tokenizer releases the GIL while it works; `encode` holds it.
            return self.tokenizer([text], add_special_tokens=False)["input_ids"][0]
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render_full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render_text(messages, tools, generation_prompt=True))

    def render_suffix(
        self, *, system: dict | None, last_assistant: dict, new_messages: list[dict], tools: list[dict] | None
    ) -> list[int] | None:
        """Ids that follow `last_assistant`'s end-of-turn token: the template's separator, the new messages and
        the generation prompt. None when the template renders no end-of-turn token for that turn.

        How the template would re-render the assistant turn itself (Qwen3 drops earlier reasoning) does not
        matter: the recorded sample keeps the ids the model sampled, and the suffix starts after them.
        """
        context = ([system] if system else []) + [_PLACEHOLDER_USER, last_assistant]
        before = self.render_text(context, tools, generation_prompt=False)
        after = self.render_text(context + new_messages, tools, generation_prompt=True)
        turns = before.count(self.end_of_turn_text)
        end = -1
        for _ in range(turns):
            end = after.find(self.end_of_turn_text, end + 1)
            if end < 0:
                return None
        if turns == 0:
            return None
        return self.encode(after[end + len(self.end_of_turn_text):])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
