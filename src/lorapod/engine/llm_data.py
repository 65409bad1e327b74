"""Chat conversations -> token rows the LLM recipe trains on.

Three steps, each a plain function:

1. ``tokenize_conversation``: render with the tokenizer's chat template, tokenize once, and
   label the tokens that overlap an assistant reply (spans from ``llm_template``: the template's
   ``{% generation %}`` markers, or per-turn rendering; mapped to tokens through the offsets, as
   transformers' ``return_assistant_tokens_mask`` does). Tokenising the whole text once avoids the
   boundary errors of tokenising pieces separately.
2. ``pack``: best-fit-decreasing bin packing of examples into rows of ``sequence_len`` tokens.
3. ``collate``: pad a micro-batch of rows, restart positions at every example, and build an
   attention mask in which no token can see another example of its row.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from lorapod.engine.llm_template import SystemPlan, assistant_spans, place_system, render
from lorapod.errors import DataError

IGNORE = -100

# Used when a tokenizer has no chat template (base models). ChatML, as axolotl and TRL use:
# every turn is "<|im_start|>{role}\n{content}<|im_end|>\n" and the generation prompt is
# "<|im_start|>assistant\n". On a tokenizer without these special tokens they are spelled out as
# ordinary text, which works but costs a few tokens per turn.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


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


def ensure_chat_template(tokenizer) -> bool:
    """Give the tokenizer the fallback template when it has none; True when the fallback is used."""
    if getattr(tokenizer, "chat_template", None):
        return False
    tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    return True


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


# ----------------------------------------------------------------------------- packing


@dataclass
class Row:
    """One training row: the examples (by index) laid end to end."""

    examples: list[int]
    length: int


def pack(examples: list[Example], sequence_len: int) -> list[Row]:
    """Best-fit decreasing: each example goes into the fullest row it still fits in.

    Deterministic (ties broken by index), O(n log n) with a sorted list of free capacities.
    Padding left over is typically < 1-2% for chat data.
    """
    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i]), i))
    rows: list[Row] = []
    free: list[tuple[int, int]] = []  # (remaining capacity, row index), sorted
    for i in order:
        n = len(examples[i])
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            cap, r = free.pop(pos)
            rows[r].examples.append(i)
            rows[r].length += n
            bisect.insort(free, (cap - n, r))
        else:
            rows.append(Row([i], n))
            bisect.insort(free, (sequence_len - n, len(rows) - 1))
    return rows


def unpacked(examples: list[Example]) -> list[Row]:
    return [Row([i], len(e)) for i, e in enumerate(examples)]


def batch_rows(rows: list[Row], micro_batch_size: int, generator: torch.Generator, group_by_length: bool) -> list[list[Row]]:
    """Shuffle rows (seeded) and cut into micro-batches.

    With ``group_by_length`` (unpacked data) rows are sorted by length inside chunks of 64
    micro-batches, so a batch pads to similar lengths while the order stays random.
    """
    perm = torch.randperm(len(rows), generator=generator).tolist()
    ordered = [rows[i] for i in perm]
    if group_by_length and micro_batch_size > 1:
        chunk = micro_batch_size * 64
        ordered = [r for s in range(0, len(ordered), chunk) for r in sorted(ordered[s : s + chunk], key=lambda r: -r.length)]
    batches = [ordered[s : s + micro_batch_size] for s in range(0, len(ordered), micro_batch_size)]
    if group_by_length and micro_batch_size > 1:
        order = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in order]
    return batches


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L)
    labels: torch.Tensor  # (B, L), IGNORE where no loss
    position_ids: torch.Tensor  # (B, L), restarting at 0 for every example
    segment_ids: torch.Tensor  # (B, L), example number within the row, -1 for padding
    n_labels: int
    n_tokens: int
    n_real: int

    def to(self, device: torch.device) -> Batch:
        return Batch(
            self.input_ids.to(device), self.labels.to(device), self.position_ids.to(device),
            self.segment_ids.to(device), self.n_labels, self.n_tokens, self.n_real,
        )

    def attention_mask(self) -> torch.Tensor:
        """(B, 1, L, L) boolean: token i sees token j iff same example and j <= i.

        Padding positions see only themselves, so no row of the mask is empty (an empty row
        would give NaN in softmax).
        """
        seg = self.segment_ids
        L = seg.shape[1]
        same = seg[:, :, None] == seg[:, None, :]
        causal = torch.ones(L, L, dtype=torch.bool, device=seg.device).tril()
        mask = same & causal[None] & (seg[:, :, None] >= 0)
        eye = torch.eye(L, dtype=torch.bool, device=seg.device)[None]
        mask = mask | (eye & (seg[:, :, None] < 0))
        return mask[:, None]


def collate(rows: list[Row], examples: list[Example], pad_id: int, pad_to_multiple: int = 1) -> Batch:
    L = max(r.length for r in rows)
    if pad_to_multiple > 1:
        L = -(-L // pad_to_multiple) * pad_to_multiple
    B = len(rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    labels = torch.full((B, L), IGNORE, dtype=torch.long)
    position_ids = torch.zeros((B, L), dtype=torch.long)
    segment_ids = torch.full((B, L), -1, dtype=torch.long)
    n_real = 0
    for b, row in enumerate(rows):
        at = 0
        for s, idx in enumerate(row.examples):
            ex = examples[idx]
            n = len(ex)
            input_ids[b, at : at + n] = torch.tensor(ex.input_ids)
            labels[b, at : at + n] = torch.tensor(ex.labels)
            position_ids[b, at : at + n] = torch.arange(n)
            segment_ids[b, at : at + n] = s
            at += n
        n_real += at
    # a label at position t is predicted from position t-1: count targets after the shift
    n_labels = int((labels[:, 1:] != IGNORE).sum())
    return Batch(input_ids, labels, position_ids, segment_ids, n_labels, B * L, n_real)
