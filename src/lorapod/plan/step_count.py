"""Counters over one training step of a model, run on torch's ``meta`` device: no weights, no GPU.

The planner's figures for the architectures it knows (plan/counted_models.py and
plan/counted_llm.py build them from their published configs, with LoRA attached the way
trainers do) are counted, not guessed:

- Memory: one forward and backward, adding up the bytes of every tensor alive at once. Weights,
  buffers and anything else made before the count starts are left out, so what remains is what
  the step itself allocates: saved activations, the backward's gradients of them, and the
  recomputed blocks under gradient checkpointing.
- FLOPs: torch's own ``FlopCounterMode`` over one forward (attention's batched matmuls apart).
- Kernels: the operators one forward dispatches that do work (views and metadata left out), an
  upper bound on the kernel launches a GPU sees without ``torch.compile``.
- Traffic: the bytes those operators read and write, each storage once per operator however it
  is broadcast (what a memory-bound elementwise chain, like a dequantisation, costs).

Attention is counted as the fused kernels every trainer uses on a GPU (flash / memory-efficient
SDPA) behave: q, k, v, the output and one float32 log-sum-exp per query are kept, never the
(query x key) matrix. On ``meta`` torch would otherwise take the math path and keep that matrix.

Needs torch: a development tool, never imported by ``lorapod plan``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GiB = 1024**3


class LiveBytes(TorchDispatchMode):
    """Track the bytes of every storage created inside the mode while it is alive; keep the peak.

    Storages are keyed by their C++ identity, so views (a transpose, a reshape) add nothing and a
    storage counts once however many tensors share it. ``exclude``: tensors made before (weights)
    whose storages must not be counted when an op returns a view of them.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._skip = {t.untyped_storage()._cdata for t in exclude}
        self._live: set[int] = set()
        self.now = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._live or key in self._skip:
            return
        size = storage.nbytes()
        self._live.add(key)
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        if key in self._live:
            self._live.discard(key)
            self.now -= size


class _FusedAttention(torch.autograd.Function):
    """What flash / memory-efficient attention keeps for the backward: q, k, v, out, log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_fused_calls = [0]  # one GPU kernel each; the stand-in above dispatches no operator that counts


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_kw):
    _fused_calls[0] += 1
    return _FusedAttention.apply(query, key, value)


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """Make ``F.scaled_dot_product_attention`` keep what a fused GPU kernel keeps (see the module)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa  # type: ignore[assignment]  # the stand-in takes the same arguments
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@dataclass(frozen=True)
class ForwardCount:
    tflops: float  # every counted FLOP of one forward
    attention_tflops: float  # of which attention's batched matmuls (q k^T and p v)
    kernels: int  # operators that do work


class _Ops(TorchDispatchMode):
    """Count the dispatched operators that compute something (not views, not metadata)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _does_work(func):
            self.count += 1
        return func(*args, **(kwargs or {}))


# Matmuls: compute-bound, timed by their FLOPs; what Traffic leaves out to see the rest.
MATMULS = ("mm.default", "addmm.default", "bmm.default")
# Operators that launch no kernel: allocation, views torch does not mark as views, detaching.
_NO_KERNEL = {"detach.default", "empty.memory_format", "empty_strided.default", "new_empty.default",
              "empty_like.default", "lift_fresh.default", "_unsafe_view.default"}


def _does_work(func: Any) -> bool:
    """An operator that launches a kernel: not a view, not an allocation or a detach."""
    return not func.is_view and func.__name__ not in _NO_KERNEL


class Traffic(TorchDispatchMode):
    """Bytes each working operator reads (its tensor inputs' storages, once each: a broadcast
    input is read once, not once per element it feeds) and writes (its outputs' storages; an
    in-place operator reads and writes the same one), and the number of such operators.
    ``skip``: operators left out (by name, e.g. the matmuls, whose time the FLOPs give)."""

    def __init__(self, skip: Iterable[str] = ()) -> None:
        super().__init__()
        self.bytes = 0
        self.kernels = 0
        self._skip = set(skip)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _does_work(func) or func.__name__ in self._skip:
            return out
        self.kernels += 1
        inputs = (args, {k: v for k, v in (kwargs or {}).items() if k != "out"})
        self.bytes += _storage_bytes(inputs) + _storage_bytes(out)  # in place: read, then written
        return out


def _storage_bytes(tree: Any) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def count_traffic(work: Callable[[], Any]) -> Traffic:
    """Bytes moved and kernels run by ``work()`` (no autograd)."""
    counter = Traffic()
    with torch.no_grad(), counter:
        work()
    return counter


def count_forward(forward: Callable[[], Any]) -> ForwardCount:
    """FLOPs and kernels of ``forward()`` (run twice: once per counter, with no autograd). FLOPs
    count attention's matmuls; kernels count attention as the one fused kernel a GPU runs."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = FlopCounterMode(display=False)
    with torch.no_grad(), flops:
        forward()
    ops = _Ops()
    before = _fused_calls[0]
    with torch.no_grad(), fused_attention(), ops:
        forward()
    attention_kernels = _fused_calls[0] - before
    by_op = flops.get_flop_counts()["Global"]
    attention = sum(v for k, v in by_op.items() if "bmm" in str(k) or "attention" in str(k))
    return ForwardCount(flops.get_total_flops() / 1e12, attention / 1e12, ops.count + attention_kernels)


@dataclass(frozen=True)
class StepMemory:
    saved_after_forward: int  # bytes alive when the forward ends (what the backward will read)
    peak: int  # bytes alive at the worst moment of forward + backward

    @property
    def peak_gib(self) -> float:
        return self.peak / GiB


def count_step(model: torch.nn.Module, forward: Callable[[], torch.Tensor]) -> StepMemory:
    """One forward (``forward()`` returns the loss) and backward of ``model`` under the counter."""
    counter = LiveBytes(exclude=[*model.parameters(), *model.buffers()])
    with fused_attention(), counter:
        loss = forward()
        saved = counter.now
        loss.backward()
    return StepMemory(saved, counter.peak)
