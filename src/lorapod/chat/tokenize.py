"""Chat conversations -> token ids with labels on the assistant replies, for the data check and the engine.

``tokenize_conversation`` renders with the tokenizer's chat template, tokenizes once, and labels
the tokens that overlap an assistant reply (spans from ``chat.template``: the template's
``{% generation %}`` markers, or per-turn rendering; mapped to tokens through the offsets, as
transformers' ``return_assistant_tokens_mask`` does). Tokenising the whole text once avoids the
boundary errors of tokenising pieces separately. ``lorapod data check --model`` counts what the
engine will train on with the same call; the engine then packs and batches the examples
(``engine/llm_data.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lorapod.chat.template import SystemPlan, assistant_spans, place_system, render
from lorapod.errors import DataError

IGNORE = -100  # the label of a token that is no target (what torch cross_entropy ignores by default)


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_labels(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)


@dataclass
class TokenizeStats:
    examples: int = 0
    truncated: int = 0
    dropped_no_labels: int = 0
    rejected: int = 0  # refused by the chat template (skipped with data.skip_bad_examples)
    shared_boundary: int = 0  # labelled tokens that straddle a reply's edge
    lengths: list[int] = field(default_factory=list)


def label_overlapping(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> tuple[list[bool], int]:
    """Which tokens overlap a reply span (transformers' rule for ``return_assistant_tokens_mask``),
    and how many of them straddle a span's edge (one token shared by prompt and reply).

    A reply that starts with a newline after a header that ends with one ("assistant\\n" +
    "\\nHello") is tokenised with both newlines in one token by vocabularies like Qwen's; that
    token overlaps the reply, so it is labelled (the model must learn to produce it).
    """
    mask = [False] * len(offsets)
    shared = 0
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        lo, hi = spans[k]
        if end > lo:
            mask[t] = True
            shared += start < lo or end > hi
    return mask, shared


def tokenize_conversation(tokenizer, messages: list[dict], sequence_len: int, assistant_only: bool = True,
                          system: SystemPlan | None = None) -> tuple[Example, bool, int]:
    """One conversation -> (Example with labels on assistant replies, truncated?, boundary tokens shared)."""
    messages = place_system(messages, system)
    if assistant_only:
        text, spans = assistant_spans(tokenizer, messages)
    else:
        text, spans = render(tokenizer, messages), []
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = enc["input_ids"]
    shared = 0
    if assistant_only:
        mask, shared = label_overlapping(enc["offset_mapping"], spans)
        labels = [i if m else IGNORE for i, m in zip(ids, mask, strict=True)]
    else:
        labels = list(ids)
    truncated = len(ids) > sequence_len
    return Example(ids[:sequence_len], labels[:sequence_len]), truncated, shared


def tokenize_all(tokenizer, conversations: list[list[dict]], sequence_len: int, assistant_only: bool = True,
                 system: SystemPlan | None = None, where: list[str] | None = None,
                 skip_bad: bool = False) -> tuple[list[Example], TokenizeStats]:
    """Tokenise every conversation. One the template refuses (or whose replies cannot be located)
    stops the job with its line (``where``), or is skipped and counted with ``skip_bad``."""
    stats = TokenizeStats()
    out = []
    bad: list[str] = []
    for k, messages in enumerate(conversations):
        try:
            ex, truncated, shared = tokenize_conversation(tokenizer, messages, sequence_len, assistant_only, system)
        except DataError as exc:
            bad.append(f"{where[k] if where else f'conversation {k + 1}'}: {exc.message}")
            continue
        stats.truncated += truncated
        stats.shared_boundary += shared
        stats.lengths.append(len(ex))
        # the first token of an example never has a predecessor, so it is never a target
        if ex.labels:
            ex.labels[0] = IGNORE
        if ex.n_labels == 0:
            stats.dropped_no_labels += 1
            continue
        out.append(ex)
    stats.rejected = len(bad)
    if bad and not skip_bad:
        shown = "\n".join(f"    {b}" for b in bad[:5])
        more = f"\n    ... and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DataError(f"{len(bad)} conversation(s) cannot be used with this model's chat template:\n{shown}{more}",
                        hint="`lorapod data check FILE --model MODEL` lists them all; fix them, or "
                        "--set data.skip_bad_examples=true to leave them out")
    stats.examples = len(out)
    return out, stats
