"""Tokens: messages to the policy's prompt ids, and sampled ids back to text, with the model's own chat template.

`rendering` renders only what is new, with the model's tokenizer and template; `templates` finds the templates TRL
ships; `shared_renders` and `chunk_ids` remember full renders and long pieces of text across rollouts; `ids_json`
serialises ids once.

Accelerators, each with its plain path, flag and audit:
- `suffix_writer`: a steady turn's suffix written without the template, for the Qwen templates whose text says how.
  Plain path: render the template's suffix. Flag: `ServerConfig.suffix_writer` (`serve --no-suffix-writer`). Audit:
  checked against the template on probes at load and one suffix in 64 while serving (a difference turns it off);
  `tests/interceptor/test_suffix_writer.py`.
- `bpe_twin`: ASCII text encoded by a tiktoken twin of the tokenizer where its ids are provably the tokenizer's.
  Plain path: the transformers tokenizer. Flag: `ServerConfig.tiktoken_twin` (`serve --no-tiktoken-twin`). Audit:
  one encode in 64 also made by the tokenizer (a difference turns it off); `tests/interceptor/test_bpe_twin.py`.
- The rendering fast path itself (the compiled template without a deep copy, a memoised `tojson`): audit
  `tests/interceptor/test_rendering_fast_path.py`, against the reference render for every template TRL ships.
"""
