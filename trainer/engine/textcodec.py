"""Token ids to text the way vLLM's detokenizer reports them.

- `text`: the generated ids decoded with special tokens skipped; when the generation ended on its eos or a stop
  token, that last token is left out of the text (it stays in `token_ids`), as vLLM does.
- `token`: one id decoded on its own with special tokens kept (vLLM's logprob `tokens` and `decoded_token`);
  cached, since logprob responses ask for the same few ids again and again.

Both drop trailing U+FFFD: a byte-level token that ends inside a UTF-8 character decodes to a replacement char,
which vLLM's incremental detokenizer holds back as unfinished (a lone partial-byte token is "" in vLLM's logprobs,
as are ids the tokenizer does not know; see tests/data/vllm_completion_example.json). A replacement char inside
the text, where the bytes are really invalid, is kept, as vLLM keeps it.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from trainer.engine.generation import GenerationResult

__all__ = ["TokenTexts"]

_UNFINISHED = "\ufffd"


class TokenTexts:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._tokens: dict[int, str] = {}

    def text(self, result: GenerationResult) -> str:
        ids = result.token_ids[:-1] if result.stopped_on_token else result.token_ids
        return self._tokenizer.decode(list(ids), skip_special_tokens=True).rstrip(_UNFINISHED)

    def token(self, token_id: int) -> str:
        text = self._tokens.get(token_id)
        if text is None:
            text = self._tokens[token_id] = self._tokenizer.decode([token_id]).rstrip(_UNFINISHED)
        return text
