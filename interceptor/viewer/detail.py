"""One rollout as the viewer shows it: the conversation the agent had, and beside it each sample at the token level.

A sample is cut into spans at its turn boundaries: `prompt` spans (mask 0: what the policy conditioned on, decoded
as one text) and `sampled` spans (each token with its text and the logprob the policy sampled it with). A sampled
span whose tokens are mask 0 here names the sample that trains them (`trained_in`: an earlier one with the same ids
before them, such as the chain a concurrent turn copied).

The tree is the rollout's chains as recorded (`SampleRecord.chain`: kind, parent sample and turn, how the parent
was found, the tokens shared with it), with each chain's depth, its sampled tokens and those it trains. A record
from before chains were recorded gets the tree the viewer can infer: each sample's parent is the earlier sample with
which it shares the longest token prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from interceptor.store.lineage_audit import common_prefix

__all__ = ["TokenText", "rollout_detail"]


class TokenText:
    """Token ids to text with a model's tokenizer, or to `<id>` placeholders without one.

    With `locate` (a function naming the model directory, or None while it is not known yet: a run that has not
    written its `setup.json`), the tokenizer is looked for again whenever a rollout is shown, until it loads."""

    def __init__(self, tokenizer=None, note: str | None = None, *,
                 locate: Callable[[], Path | str | None] | None = None) -> None:
        self._tokenizer = tokenizer
        self.note = note
        self._locate = locate
        self._tried: Path | str | None = None
        self._one = lru_cache(maxsize=1 << 16)(self._decode_one)

    @classmethod
    def load(cls, model: Path | str | None, *, locate: Callable[[], Path | str | None] | None = None) -> TokenText:
        """The tokenizer of a local model directory; without one, placeholders and a note saying why."""
        text = cls(locate=locate)
        text._load(model)
        return text

    def _load(self, model: Path | str | None) -> None:
        self._tried = model
        if model is None:
            self.note = "no tokenizer: start the viewer with --model DIR to see token text"
            return
        try:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
            self.note = None
        except Exception as exc:  # a directory without a tokenizer, or a hub name not in the local cache
            self.note = f"no tokenizer from {model}: {type(exc).__name__}: {str(exc)[:200]}"

    def refresh(self) -> None:
        """Look for the tokenizer again (see `locate`); a no-op once it is loaded or when nothing changed."""
        if self._tokenizer is None and self._locate is not None:
            model = self._locate()
            if model is not None and model != self._tried:
                self._load(model)

    @property
    def available(self) -> bool:
        return self._tokenizer is not None

    def text(self, ids: list[int]) -> str:
        if self._tokenizer is None:
            return " ".join(f"<{i}>" for i in ids)
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def token(self, token_id: int) -> str:
        return self._one(token_id) if self._tokenizer is not None else f"<{token_id}>"

    def _decode_one(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)


def _spans(sample: dict, text: TokenText, earlier: list[dict]) -> list[dict]:
    ids, mask, logprobs = sample["input_ids"], sample["completion_mask"], sample["old_logprobs"]
    spans: list[dict] = []
    at = 0
    for number, turn in enumerate(sample.get("turns") or []):
        start, end = turn["completion_start"], turn["completion_end"]
        if start > at:
            spans.append({"kind": "prompt", "turn": number, "start": at, "end": start,
                          "text": text.text(ids[at:start])})
        tokens = [{"id": ids[i], "text": text.token(ids[i]), "logprob": logprobs[i], "mask": mask[i]}
                  for i in range(start, end)]
        spans.append({"kind": "sampled", "turn": number, "start": start, "end": end, "tokens": tokens,
                      "finish_reason": turn.get("finish_reason"), "policy_version": turn.get("policy_version"),
                      "malformed_tool_call": turn.get("malformed_tool_call", False),
                      "spans_sync": turn.get("spans_sync", False),
                      "trained_in": _trained_in(ids, start, earlier) if end > start and not mask[start] else None})
        at = end
    if at < len(ids):  # a sample that ends on prompt tokens (none do today; shown rather than dropped)
        spans.append({"kind": "prompt", "turn": None, "start": at, "end": len(ids), "text": text.text(ids[at:])})
    return spans


def _trained_in(ids: list[int], position: int, earlier: list[dict]) -> int | None:
    """The earlier sample that trains the token at `position` (same ids through it, mask 1 there)."""
    for other in earlier:
        if len(other["input_ids"]) > position and other["completion_mask"][position] \
                and other["input_ids"][: position + 1] == ids[: position + 1]:
            return other.get("index")
    return None


def chain_tree(samples: list[dict]) -> list[dict]:
    """One node per sample: its chain as recorded (inferred for older records), its depth in the tree, and its
    sampled tokens (`sampled`) against those it trains (`trained`)."""
    tree = []
    for i, sample in enumerate(samples):
        chain = sample.get("chain") or _inferred_chain(samples, i)
        sampled = sum(t["completion_end"] - t["completion_start"] for t in sample.get("turns") or [])
        tree.append({"sample": sample.get("index", i), "kind": chain["kind"], "parent": chain.get("parent"),
                     "parent_turn": chain.get("parent_turn"), "linked_by": chain.get("linked_by"),
                     "shared_tokens": chain.get("shared", 0), "fork_reason": sample.get("fork_reason"),
                     "auxiliary": bool(sample.get("auxiliary")), "sampled": sampled,
                     "trained": sum(sample["completion_mask"])})
    parents = {node["sample"]: node["parent"] for node in tree}
    for node in tree:
        depth, at = 0, node["parent"]
        while at is not None and depth < len(tree):
            depth, at = depth + 1, parents.get(at)
        node["depth"] = depth
    return tree


def _inferred_chain(samples: list[dict], i: int) -> dict:
    sample, parent, shared = samples[i], None, 0
    for j in range(i):
        common = common_prefix(np.asarray(samples[j]["input_ids"]), np.asarray(sample["input_ids"]))
        if common > shared:
            parent, shared = samples[j].get("index", j), common
    kind = "auxiliary" if sample.get("auxiliary") else ("main" if parent is None else "fork")
    return {"kind": kind, "parent": parent, "linked_by": "history" if parent is not None else None, "shared": shared}


def rollout_detail(record: dict, text: TokenText) -> dict:
    text.refresh()
    samples = record.get("samples") or []
    shown = []
    for number, sample in enumerate(samples):
        mask = sample["completion_mask"]
        sampled = [lp for lp, m in zip(sample["old_logprobs"], mask) if m]
        shown.append({
            "index": sample.get("index"), "auxiliary": bool(sample.get("auxiliary")),
            "fork_reason": sample.get("fork_reason"), "length": len(sample["input_ids"]),
            "sampled_tokens": len(sampled), "mean_logprob": sum(sampled) / len(sampled) if sampled else None,
            "turns": len(sample.get("turns") or []), "spans": _spans(sample, text, samples[:number]),
            "chain": sample.get("chain"),
        })
    return {
        "rollout_id": record.get("rollout_id"), "mode": record.get("mode"), "status": record.get("status"),
        "reward": record.get("reward"), "answer": record.get("answer"), "failure": record.get("failure"),
        "usage": record.get("usage"), "events": record.get("events") or [], "metadata": record.get("metadata") or {},
        "started_at": record.get("started_at"), "finished_at": record.get("finished_at"),
        "trace": record.get("trace") or [], "samples": shown, "tree": chain_tree(samples),
        "tokenizer": text.available, "tokenizer_note": text.note,
    }
