"""Tokenised conversations -> the rows and batches the LLM recipe trains on.

Two steps after ``chat.tokenize`` has turned each conversation into an ``Example``, each a plain
function:

1. ``pack``: best-fit-decreasing bin packing of examples into rows of ``sequence_len`` tokens.
2. ``collate``: pad a micro-batch of rows and restart positions at every example; the restarting
   positions are what keeps examples apart (engine/attention.py). ``Batch.attention_mask`` is the
   explicit block-diagonal causal mask the recipe used before (kept for tests and the benchmark).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from lorapod.chat.tokenize import IGNORE, Example

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
    #: The B x L tokens laid end to end, cut into the sequences attention sees: every example, and
    #: each row's padding as one run (it comes last in its row, so no real token sees it). Built on
    #: the CPU by :func:`collate`, so no kernel reads them back from the GPU (reviews N3, N8, N10).
    seq_lens: tuple[int, ...] = ()
    pad_seqs: tuple[bool, ...] = ()  # which of ``seq_lens`` are padding runs
    #: int32 (n + 1,): the cumulative ``seq_lens`` (FlashAttention's ``cu_seqlens``), on the batch's device
    cu_seqlens: torch.Tensor | None = None
    #: (N, 2) long: the (row, position) of each target after the shift (labels[:, 1:]), in row-major order
    label_pos: torch.Tensor | None = None

    @property
    def max_seqlen(self) -> int:
        return max(self.seq_lens, default=0)

    def to(self, device: torch.device) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(
            self.input_ids.to(device), self.labels.to(device), self.position_ids.to(device),
            self.segment_ids.to(device), self.n_labels, self.n_tokens, self.n_real,
            self.seq_lens, self.pad_seqs, move(self.cu_seqlens), move(self.label_pos),
        )

    def flattened(self) -> Batch:
        """The real tokens of every row laid end to end in one row, without padding: what
        FlashAttention's varlen path takes (engine/attention.py). The first token of every example
        is never a target, so no target crosses from one row into the next. Done on the CPU,
        before the batch moves to the GPU (engine/llm.py)."""
        keep = self.segment_ids >= 0
        # segment numbers restart per row: offset them so examples of different rows stay apart
        seg = self.segment_ids + (self.segment_ids.max() + 1) * torch.arange(self.segment_ids.shape[0])[:, None].to(
            self.segment_ids.device)
        n = int(keep.sum())
        lens = tuple(x for x, pad in zip(self.seq_lens, self.pad_seqs, strict=True) if not pad)
        labels = self.labels[keep][None]
        return Batch(self.input_ids[keep][None], labels, self.position_ids[keep][None],
                     seg[keep][None], self.n_labels, n, self.n_real, lens, (False,) * len(lens),
                     cumulative(lens) if lens else None, (labels[:, 1:] != IGNORE).nonzero())

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
    label_pos = (labels[:, 1:] != IGNORE).nonzero()
    lens: list[int] = []
    pads: list[bool] = []
    for row in rows:
        lens += [len(examples[i]) for i in row.examples]
        pads += [False] * len(row.examples)
        if row.length < L:
            lens.append(L - row.length)
            pads.append(True)
    return Batch(input_ids, labels, position_ids, segment_ids, int(label_pos.shape[0]), B * L, n_real,
                 tuple(lens), tuple(pads), cumulative(lens), label_pos)


def cumulative(lengths) -> torch.Tensor:
    """``cu_seqlens``: int32 (n + 1,), 0 then the running sum of ``lengths``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
    return out
