"""A tiktoken twin of the policy's tokenizer: transformers' ids for ASCII text, about four times faster.

On Qwen's vocabulary, `tokenizers` spends most of an `encode` in its pre-tokenizer's split regex (268 of 312 µs
for a 260-token tool result); tiktoken runs the same regex and the same byte-level BPE in a fraction of that. The
gate encodes every turn's new messages, so the tokenizer was the largest cost of a busy gate (20% of its samples).

The twin is built only where its ids are transformers' ids, and `build_twin` says why not otherwise:
- the model is byte-level BPE (no dropout, no unknown token, no byte fallback, no word prefix or suffix); the
  pre-tokenizer is one `Split` regex (isolated, not inverted) then `ByteLevel` with no regex or prefix space of its
  own; the normalizer is none or a Unicode normal form, the identity on ASCII;
- merge order is rank order: the merges are sorted by the id of the token each makes, and every cut of a token
  into two tokens is a merge. Then "merge the adjacent pair listed first" (transformers) and "merge the adjacent
  pair whose join has the lowest rank" (tiktoken) pick the same pair. Vocabularies made from tiktoken ranks (Qwen,
  Llama 3) are so;
- a piece that is itself a token comes out as that token in both (tiktoken takes it at once): transformers'
  `ignore_merges`, or else every token's own BPE gives it back;
- the added tokens are split off alike: none strips spaces or matches whole words only, none is a prefix of
  another (tiktoken's alternation takes the first that matches, `tokenizers` the longest), none has a
  vocabulary id;
- the text is ASCII (`Renderer.encode` asks the twin only then): the two regex engines (Oniguruma, fancy-regex)
  read `\\p{L}`, `\\p{N}` and `\\s` from their own Unicode tables, which can disagree on rare letters; on ASCII they
  agree;
- a probe agrees: every ASCII character in several contexts, and every added token in a sentence.

Sampled ids are decoded by the twin too where `build_twin` found its text the tokenizer's for the whole vocabulary
(tiktoken's bytes, special added tokens left out, invalid UTF-8 replaced as Rust's lossy decoding replaces it) and
transformers cleans up no spaces; the tokenizer's decoder walks more tables, which a turn finds cold.

While serving, one encode in `AUDIT_EVERY` is made by transformers too, and so is one decode. A difference turns
the twin (or its decoding) off for good, is logged (lengths, not text) and counted, and that call returns
transformers' answer. Where merge ties could part the two (one token made from two cuts at once),
`tests/interceptor/test_bpe_twin.py` drives both over repeated and mixed characters; none has.

The checks take about a second on a 150k vocabulary; a twin is kept per tokenizer file for the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

__all__ = ["AUDIT_EVERY", "BpeTwin", "build_twin"]

log = logging.getLogger("interceptor.tokenizer")

AUDIT_EVERY = 64  # one encode in this many is also made by transformers and compared
_UNICODE_FORMS = {"NFC", "NFKC", "NFD", "NFKD"}  # normalizers that leave ASCII as it is

Reference = Callable[[list[str]], list[list[int]]]  # transformers' ids of each text, without special tokens added
ReferenceDecode = Callable[[list[int]], str]  # transformers' text of ids, special tokens skipped


class BpeTwin:
    """tiktoken's encoder (and decoder) for one tokenizer's vocabulary, audited against transformers while it
    serves."""

    def __init__(self, encoding, reference: Reference, *, skipped: frozenset[int] = frozenset(),
                 reference_decode: ReferenceDecode | None = None) -> None:
        self._encoding = encoding
        self._reference = reference
        self._calls = 0
        self._lock = threading.Lock()
        self.on = True
        self.mismatches = 0  # audited encodes whose ids differed (the first turns the twin off)
        # Decoding: the special added tokens are left out (`skip_special_tokens`); off where no check vouched for it
        self._skipped = skipped
        self._reference_decode = reference_decode
        self._decodes = 0
        self.decodes = reference_decode is not None
        self.decode_mismatches = 0

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text`, or None when the twin does not answer for it (not ASCII, or turned off)."""
        if not (self.on and text.isascii()):
            return None
        ids = self._encoding.encode(text, allowed_special="all")  # releases the GIL
        with self._lock:
            self._calls += 1
            audit = self._calls % AUDIT_EVERY == 0
        if audit:
            reference = self._reference([text])[0]
            if reference != ids:
                self._turn_off(text, ids, reference)
                return reference
        return ids

    def decode(self, ids: list[int]) -> str | None:
        """The text of `ids` as transformers decodes it with `skip_special_tokens` (invalid UTF-8 replaced), or None
        when the twin does not answer (turned off, or an id outside its vocabulary)."""
        if not self.decodes:
            return None
        skipped = self._skipped
        try:
            data = self._encoding.decode_bytes(ids if skipped.isdisjoint(ids) else [i for i in ids if i not in skipped])
        except KeyError:
            return None
        text = data.decode("utf-8", "replace")
        self._decodes += 1  # (a count two threads race on only moves the next audit)
        if self._decodes % AUDIT_EVERY == 0 and self._reference_decode is not None:
            reference = self._reference_decode(ids)
            if reference != text:
                with self._lock:
                    self.decode_mismatches += 1
                    was_on, self.decodes = self.decodes, False
                if was_on:
                    log.error("the tiktoken twin decoded %d ids to another text than the tokenizer (%d vs %d "
                              "characters); its decoding is off for the rest of this process", len(ids), len(text),
                              len(reference))
                return reference
        return text

    def _turn_off(self, text: str, ids: list[int], reference: list[int]) -> None:
        first = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), min(len(ids), len(reference)))
        with self._lock:
            self.mismatches += 1
            was_on, self.on = self.on, False
        if was_on:
            log.error(
                "the tiktoken twin gave other ids than the tokenizer for a text of %d characters (%d vs %d ids, the "
                "first difference at id %d); it is off for the rest of this process, and transformers encodes",
                len(text), len(ids), len(reference), first,
            )


_built: dict[tuple, object] = {}
_decode_checked: dict[tuple, bool] = {}
_built_lock = threading.Lock()


def build_twin(tokenizer, model_dir: Path | str) -> tuple[BpeTwin | None, str]:
    """A twin of `tokenizer` (a transformers fast tokenizer loaded from `model_dir`) and "", or None and why not."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is None:
        return None, "the tokenizer is not a fast (Rust) tokenizer"
    path = Path(model_dir) / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError:
        return None, f"{path} does not exist"
    added = tuple(
        (int(i), t.content, bool(t.lstrip), bool(t.rstrip), bool(t.single_word))
        for i, t in sorted(tokenizer.added_tokens_decoder.items())
    )
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, added)
    with _built_lock:
        kept = _built.get(key)
    if kept is None:
        try:
            kept = _encoding_for(path, added)
        except _NotTwin as exc:
            kept = str(exc)
        with _built_lock:
            _built[key] = kept
    if isinstance(kept, str):
        log.info("the tokenizer encodes all text (no tiktoken twin: %s)", kept)
        return None, kept

    def reference(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in rust.encode_batch(texts, add_special_tokens=False)]

    def reference_decode(ids: list[int]) -> str:
        return rust.decode(ids, skip_special_tokens=True)

    skipped = frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
    decodes = False
    if not getattr(tokenizer, "clean_up_tokenization_spaces", True):  # else transformers edits spaces after decoding
        with _built_lock:
            decodes = _decode_checked.get((key, skipped))
        if decodes is None:
            decodes = _decodes_alike(kept, rust, skipped)
            with _built_lock:
                _decode_checked[(key, skipped)] = decodes
    twin = BpeTwin(kept, reference, skipped=skipped, reference_decode=reference_decode if decodes else None)
    probe = _probe_texts([content for _, content, *_ in added])
    if [twin._encoding.encode(t, allowed_special="all") for t in probe] != reference(probe):
        return None, "the probe texts gave other ids with tiktoken (the tokenizer in memory is not its file's?)"
    log.info("ASCII text is encoded by the tokenizer's tiktoken twin (audited, 1 in %d)%s", AUDIT_EVERY,
             ", sampled ids decoded by it too" if decodes else "")
    return twin, ""


def _decodes_alike(encoding, rust, skipped: frozenset[int]) -> bool:
    """Whether tiktoken's bytes of ids (special added tokens left out, invalid UTF-8 replaced as Rust's lossy
    decoding does) give the tokenizer's text: the whole vocabulary in runs of 256 ids, most of which hold broken
    UTF-8 where tokens meet (0.1 s on a 150k vocabulary). Random runs agree too (`test_bpe_twin.py`)."""
    size = rust.get_vocab_size(with_added_tokens=True)
    ids = list(range(size))
    runs = [ids[start:start + 256] for start in range(0, size, 256)]
    try:
        return all(encoding.decode_bytes([i for i in run if i not in skipped]).decode("utf-8", "replace")
                   == rust.decode(run, skip_special_tokens=True) for run in runs)
    except KeyError:  # an id tiktoken lacks (a gap in the vocabulary)
        return False


class _NotTwin(Exception):
    pass


def _encoding_for(path: Path, added: tuple):
    import tiktoken

    spec = orjson.loads(path.read_bytes())
    pattern = _split_pattern(spec)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise _NotTwin(f"the model is {model.get('type')}, not BPE")
    for field in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(field):
            raise _NotTwin(f"the BPE model sets {field}")
    if model.get("byte_fallback"):
        raise _NotTwin("the BPE model falls back to bytes")
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") not in _UNICODE_FORMS:
        raise _NotTwin(f"the normalizer {normalizer.get('type')} can change ASCII text")

    specials: dict[str, int] = {}
    contents = [content for _, content, *_ in added]
    for token_id, content, lstrip, rstrip, single_word in added:
        if lstrip or rstrip or single_word:
            raise _NotTwin(f"the added token {content!r} strips spaces or matches whole words only")
        if any(other != content and other.startswith(content) for other in contents):
            raise _NotTwin(f"the added token {content!r} is a prefix of another")
        specials[content] = token_id

    to_byte = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab: dict[str, int] = model.get("vocab") or {}
    ranks: dict[bytes, int] = {}
    for token, rank in vocab.items():
        try:
            ranks[bytes(to_byte[ch] for ch in token)] = rank
        except KeyError:
            raise _NotTwin(f"the token {token!r} is not byte-level") from None
    ids = set(ranks.values())
    if len(ids) != len(ranks):
        raise _NotTwin("two tokens share an id")
    if clash := next((content for content, token_id in specials.items() if token_id in ids), None):
        raise _NotTwin(f"the added token {clash!r} has a vocabulary id")
    _check_merges(vocab, model.get("merges") or [])
    if not model.get("ignore_merges"):
        _check_every_token_its_own_bpe(path, vocab)

    return tiktoken.Encoding(
        name=f"twin-{path.parent.name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


def _split_pattern(spec: dict) -> str:
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if len(steps) != 2:
        raise _NotTwin("the pre-tokenizer is not a split regex then byte-level")
    split, byte_level = steps
    if split.get("type") != "Split" or "Regex" not in (split.get("pattern") or {}):
        raise _NotTwin("the pre-tokenizer does not start with a Split regex")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise _NotTwin("the split regex does not isolate its matches")
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        raise _NotTwin("the byte-level step adds a regex or a prefix space of its own")
    return split["pattern"]["Regex"]


def _check_merges(vocab: dict[str, int], merges: list) -> None:
    """Merge order is rank order, and every cut of a token into two tokens is a merge."""
    listed: set[tuple[str, str]] = set()
    last = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = vocab.get(left + right)
        if made is None:
            raise _NotTwin(f"the merge {left!r} + {right!r} makes no token")
        if made < last:
            raise _NotTwin("the merges are not in the order of the ids they make")
        last = made
        listed.add((left, right))
    for token in vocab:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab and (left, right) not in listed:
                raise _NotTwin(f"{left!r} + {right!r} makes a token but is not a merge")


def _check_every_token_its_own_bpe(path: Path, vocab: dict[str, int]) -> None:
    from tokenizers import Tokenizer

    bpe = Tokenizer.from_file(str(path)).model
    for token, rank in vocab.items():
        got = bpe.tokenize(token)
        if len(got) != 1 or got[0].id != rank:
            raise _NotTwin(f"the token {token!r} does not come out of its own BPE (and merges are not ignored)")


def _probe_texts(added: list[str]) -> list[str]:
    texts = []
    for code in range(128):
        c = chr(code)
        texts += [c, f"a{c}b", f" {c}{c} ", f"x {c}\n1{c}'s", f"{c}  \n\n {c}\t{c}{c}{c}Word"]
    sample = (
        "def main(argv):\n    return {'path': \"/tmp/x.txt\", 'n': 42}  # it's 3.14\r\n\n\n   \t\n"
        "I'LL SEE you're ok -- ===== ***** ____ //// 12345678 \x1b[0m\x00end"
    )
    texts.append(sample)
    texts.append(" ".join(added) + sample + "".join(added))
    return texts


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
