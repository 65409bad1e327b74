"""Packed attention, one layer, forward + backward: aten ops, bytes written and tokens per CPU-second of
each path lorapod has had (review N3), at 2,048 / 4,096 / 8,192 tokens per row.

    PYTHONPATH=src python bench/attention_ops.py                 # the table in docs/performance.md
    PYTHONPATH=src python bench/attention_ops.py --lengths 2048 --rows 4 --repeat 3

Paths, on the same packed rows (Qwen2.5-0.5B heads: 14 query / 2 key-value heads of 64; examples of
lognormal length, median ~195 tokens as gpu_check's chat data, packed best-fit into 4 rows):

- ``slice_loop``: lorapod's padding-free SDPA before this change, one SDPA per example on slices of
  the (B, H, L, D) tensors; each slice's backward writes a zero tensor of the whole input;
- ``split``: the same SDPA calls on pieces of ``torch.split`` over the flat tokens (backward: one cat),
  the path lorapod runs where torch has no varlen kernel (CPU, torch 2.7/2.8, fp32);
- ``dense``: one SDPA call with the boolean (B, 1, L, L) block-diagonal mask, the reference (up to
  2,048 tokens: beyond, its per-head float copy of the mask does not fit this machine);
- ``varlen_attn``: torch's FlashAttention varlen kernel (CUDA only; counted on the meta device, its
  registered fake: ops and bytes of what it returns, not of the kernel's internals).

Ops and bytes are counted with a ``TorchDispatchMode`` (every aten op, the bytes of each output that is
not a view); time is wall-clock per fwd+bwd on this CPU (median of ``--repeat``), in fp32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

HEADS, KV, DIM = 14, 2, 64


class Counter(TorchDispatchMode):
    """aten ops by name and the bytes of their non-view outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t._is_view():
                self.bytes += t.numel() * t.element_size()
        return out


def packed_rows(length: int, rows: int, seed: int = 0):
    """Best-fit packed rows of lognormal example lengths (median ~195, as chat data): a collated
    Batch of ``rows`` x ``length`` tokens."""
    from lorapod.chat.tokenize import Example
    from lorapod.engine import llm_data

    g = torch.Generator().manual_seed(seed)
    examples: list[Example] = []
    while sum(len(e) for e in examples) < rows * length * 0.97:
        n = int(min(length, max(8, float(torch.empty(1).log_normal_(5.27, 0.6, generator=g)))))
        examples.append(Example([1] * n, [-100] + [1] * (n - 1)))
    packed = llm_data.pack(examples, length)[:rows]
    return llm_data.collate(packed, examples, pad_id=0)


def slice_loop(query, key, value, position_ids):
    """lorapod's padding-free SDPA before review N3: slices of the (B, H, L, D) tensors per example."""
    from lorapod.engine.attention import spans

    _B, H = query.shape[:2]
    rep = H // key.shape[1]
    rows = []
    for b, row in enumerate(spans(position_ids)):
        pieces = []
        for s, e in row:
            q, k, v = query[b:b + 1, :, s:e], key[b:b + 1, :, s:e], value[b:b + 1, :, s:e]
            if e - s == 1:
                pieces.append(v.repeat_interleave(rep, dim=1))
                continue
            pieces.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=rep > 1))
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2)


def run(path: str, batch, device: str = "cpu", dtype=torch.float32):
    """One fwd+bwd of ``path`` on ``batch``; returns the output (for equality checks)."""
    from lorapod.engine import attention

    B, L = batch.input_ids.shape
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, HEADS, L, DIM, generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(B, KV, L, DIM, generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(B, KV, L, DIM, generator=g).to(device, dtype).requires_grad_()
    module = SimpleNamespace(training=True, is_causal=True)
    if path == "slice_loop":
        out = slice_loop(q, k, v, batch.position_ids.to(device))
    elif path == "dense":
        mask = batch.attention_mask().to(device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    else:
        moved = batch.to(torch.device(device))
        kw = attention.forward_kwargs(moved, attention.AttentionPath("sdpa", False, "bench"), dtype)
        kw.pop("attention_mask")
        if path == "varlen_attn":
            real = attention.packed_kernel
            attention.packed_kernel = lambda query, dropout=0.0: "varlen_attn"  # type: ignore[assignment]
            try:
                out, _ = attention.varlen_sdpa(module, q, k, v, None, **kw)
            finally:
                attention.packed_kernel = real  # type: ignore[assignment]
        else:
            out, _ = attention.varlen_sdpa(module, q, k, v, None, **kw)
    out.float().sum().backward()
    return out


def measure(length: int, rows: int, repeat: int, paths: tuple[str, ...]) -> list[dict]:
    batch = packed_rows(length, rows)
    n_ex = sum(1 for p in batch.pad_seqs if not p)
    out = []
    for path in paths:
        if path == "dense" and length > 2048:  # its float mask per head: 15 GB at 4 x 8,192
            continue
        device = "meta" if path == "varlen_attn" else "cpu"
        if path == "varlen_attn":
            try:
                import torch.nn.attention.varlen  # noqa: F401
            except ImportError:
                continue
        with Counter() as c:
            run(path, batch, device)
        row = {"tokens": length, "rows": rows, "examples": n_ex, "path": path, "ops": sum(c.ops.values()),
               "written_mib": round(c.bytes / 2**20, 1), "slice_backward": c.ops.get("slice_backward", 0)}
        if device == "cpu":
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                run(path, batch, device)
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            row["ms"] = round(sec * 1e3, 1)
            row["tokens_per_cpu_s"] = round(rows * length / sec)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--paths", default="slice_loop,split,dense,varlen_attn")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        for r in measure(n, args.rows, args.repeat, tuple(args.paths.split(","))):
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


if __name__ == "__main__":
    main()
