"""The tokens an unpacked LLM job really computes: each micro-batch padded to its longest row.

Without packing (``data.packing: false``) every example is its own row, and the engine's
``collate`` (engine/llm_data.py) pads a micro-batch to the longest row in it (rounded up to 8
tokens on CUDA, 64 where the model gets an explicit mask: ``AttentionPath.pad_multiple``). Its
``batch_rows`` shuffles the rows each epoch and, with more than one row per micro-batch, sorts them
by length inside chunks of 64 micro-batches (``group_by_length``), so a batch holds rows of similar
length. The padded positions run through every linear layer like real tokens; only
FlashAttention's varlen path (``train.attention: flash``) drops them (``Batch.flattened``).

So a step costs ``micro_batch_size x its longest row`` tokens, not ``micro_batch_size x
data.sequence_len`` (which would be a packed row's cost), nor the real tokens alone.
:func:`padded_tokens` replays the engine's batching on the data's own lengths, one seeded shuffle
per epoch (the planner runs without torch, so the shuffles are Python's, not the engine's: the
same rule, an equally likely order). :data:`ASSUMED_PAD` covers a job whose data is not here.
``tests/test_plan_padding.py`` checks the figure against the engine's own ``batch_rows`` and
``collate`` on the same lengths.
"""

from __future__ import annotations

import random

#: engine/llm_data.py ``batch_rows``: rows are sorted by length inside chunks of this many micro-batches
GROUP_CHUNK_BATCHES = 64
#: engine/attention.py ``AttentionPath.pad_multiple`` on CUDA: with and without an explicit mask
PAD_MULTIPLE_MASK = 64
PAD_MULTIPLE = 8
#: With no data here, each unpacked row is assumed to pad to this multiple of the assumed example
#: length: rows of one micro-batch are grouped by length, so the longest is near the others
#: (an assumption, said in the plan; the data's own lengths replace it once the file is here).
ASSUMED_PAD = 1.1


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def batches(lengths: list[int], micro_batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch's micro-batches of row lengths, as ``engine/llm_data.py: batch_rows`` cuts them
    for unpacked rows (``group_by_length``)."""
    ordered = list(lengths)
    rng.shuffle(ordered)
    if micro_batch_size > 1:
        chunk = micro_batch_size * GROUP_CHUNK_BATCHES
        ordered = [n for s in range(0, len(ordered), chunk) for n in sorted(ordered[s:s + chunk], reverse=True)]
    return [ordered[s:s + micro_batch_size] for s in range(0, len(ordered), micro_batch_size)]


def padded_tokens(lengths: list[int], micro_batch_size: int, epochs: int, seed: int,
                  pad_multiple: int = PAD_MULTIPLE, drops_padding: bool = False) -> tuple[int, int]:
    """(token positions computed, micro-batches) over ``epochs`` of unpacked rows of ``lengths``:
    each micro-batch is ``len(batch) x`` its longest row rounded up to ``pad_multiple``; with
    ``drops_padding`` (FlashAttention varlen) the real tokens alone."""
    rng = random.Random(seed)
    total = steps = 0
    for _ in range(max(1, epochs)):
        for b in batches(lengths, micro_batch_size, rng):
            total += sum(b) if drops_padding else len(b) * _round_up(max(b), pad_multiple)
            steps += 1
    return total, steps
