"""Packed attention on the paths that are fast on a GPU (review N3, N8, N10): collate builds the
sequence boundaries on the CPU; lorapod's padding-free sdpa runs torch's FlashAttention varlen kernel
where torch has it, and otherwise one SDPA per example on pieces of ``torch.split`` (no full-size zero
tensor per example in the backward, as the loop of slices wrote); flash_attn is taken only when it
really imports; nothing is read back from the device per layer or per micro-batch. Tiny models, CPU;
the varlen call runs on torch's meta device (its registered fake), the kernel itself only on CUDA."""

from __future__ import annotations

import builtins
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lorapod.chat.tokenize import IGNORE
from lorapod.engine import attention, llm_data
from lorapod.engine.llm import _TokenLosses

from .test_engine_llm_attention import OLD, _batch, _llama, _run

torch.set_num_threads(1)
SDPA_PATH = attention.AttentionPath("sdpa", False, "test")


def test_collate_builds_the_sequence_boundaries_and_target_positions_on_the_cpu():
    batch, _examples, _ = _batch(lengths=((9, 14, 5), (20, 6)), pad_multiple=8)  # rows of 28 and 26 -> L = 32
    assert batch.seq_lens == (9, 14, 5, 4, 20, 6, 6) and batch.pad_seqs == (False,) * 3 + (True,) + (False,) * 2 + (True,)
    assert batch.cu_seqlens.dtype == torch.int32 and batch.cu_seqlens.device.type == "cpu"
    assert batch.cu_seqlens.tolist() == [0, 9, 23, 28, 32, 52, 58, 64] and batch.max_seqlen == 20
    assert torch.equal(batch.label_pos, (batch.labels[:, 1:] != IGNORE).nonzero())
    flat = batch.flattened()
    assert flat.seq_lens == (9, 14, 5, 20, 6) and flat.cu_seqlens.tolist() == [0, 9, 23, 28, 48, 54]
    assert flat.label_pos.shape[0] == flat.n_labels == batch.n_labels


def _run_with_boundaries(model, batch):
    """The recipe's own loss module, as training calls it: forward_kwargs hands the decoder collate's
    ``cu_seq_lens`` and the target positions come from collate."""
    attention.register()
    model.set_attn_implementation(attention.LORAPOD_SDPA)
    model.zero_grad(set_to_none=True)
    losses = _TokenLosses(model.model, model.lm_head, None, SDPA_PATH)
    nll, _ = losses(batch)
    nll.sum().backward()
    return nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_split_path_with_collates_boundaries_equals_the_explicit_mask():
    model = _llama()
    batch, _, _ = _batch()
    ref_nll, ref_grads, _ = _run(model, batch, OLD)
    nll, grads = _run_with_boundaries(model, batch)
    assert torch.allclose(nll, ref_nll, atol=1e-5, rtol=1e-5)
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


def test_nothing_is_read_back_from_the_device_in_a_forward(monkeypatch):
    """The review's N10: ``where.nonzero()`` and ``hidden[where]`` (a boolean index: a sync) per
    micro-batch, the spans' ``.cpu()`` per forward. With collate's boundaries and target positions
    none of those run; a boolean mask index or a nonzero would raise here."""
    model = _llama()
    batch, _, _ = _batch()
    calls: list[str] = []
    for name in ("nonzero", "tolist", "item", "cpu"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    _run_with_boundaries(model, batch)
    assert calls == [], calls


class Counter(TorchDispatchMode):
    """aten ops and the bytes of their outputs (what the review's E1 counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not t._is_view():  # a view writes nothing
                self.bytes += t.numel() * t.element_size()
        return out


def test_the_split_paths_backward_writes_no_full_size_tensor_per_example():
    """One layer's attention, 2 rows x 512 tokens of 16 examples each: the loop of slices wrote a
    zero (B, H, L, D) tensor per example in its backward (slice_backward); pieces of torch.split
    come back with one cat."""
    from types import SimpleNamespace

    lengths = [[32] * 16, [32] * 16]
    batch, _, _ = _batch(lengths=tuple(tuple(r) for r in lengths), pad_multiple=1)
    B, H, KV, L, D = 2, 4, 2, 512, 16
    q = torch.randn(B, H, L, D, requires_grad=True)
    k = torch.randn(B, KV, L, D, requires_grad=True)
    v = torch.randn(B, KV, L, D, requires_grad=True)
    kw = attention.forward_kwargs(batch, SDPA_PATH, torch.float32)
    module = SimpleNamespace(training=True, is_causal=True)
    with Counter() as count:
        out, _ = attention.varlen_sdpa(module, q, k, v, None, position_ids=batch.position_ids,
                                       cu_seq_lens_q=kw["cu_seq_lens_q"])
        out.sum().backward()
    assert "slice_backward" not in count.ops, count.ops
    whole = B * H * L * D * 4  # one full-size fp32 tensor
    # the loop of slices wrote 207 full-size tensors here (192 slice_backward zeros); pieces of split: 40
    # (97 under torch 2.6, whose CPU SDPA backward clones more; the bound is the slices' zeros)
    assert count.bytes < 150 * whole, (count.bytes / whole, count.ops)


def test_cuda_runs_torchs_varlen_kernel_once_per_layer(monkeypatch):
    """On CUDA with torch's varlen_attn: one call for the whole micro-batch, with collate's
    boundaries, GQA and causal windows as FlashAttention takes them. Run on the meta device
    (varlen_attn's registered fake), the CUDA check mocked."""
    varlen = pytest.importorskip("torch.nn.attention.varlen", reason="this torch has no varlen_attn (2.7, 2.8)")
    from types import SimpleNamespace

    seen = []
    real = varlen.varlen_attn

    def spy(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.append((q.shape, k.shape, cu_q, max_q, kw))
        return real(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    monkeypatch.setattr(varlen, "varlen_attn", spy)
    monkeypatch.setattr(attention, "packed_kernel", lambda query, dropout=0.0: "varlen_attn")
    batch, _, _ = _batch()
    B, L = batch.input_ids.shape
    q = torch.empty(B, 4, L, 16, device="meta", dtype=torch.bfloat16)
    k = torch.empty(B, 2, L, 16, device="meta", dtype=torch.bfloat16)
    kw = attention.forward_kwargs(batch.to(torch.device("meta")), SDPA_PATH, torch.bfloat16)
    kw.pop("attention_mask")
    module = SimpleNamespace(training=True, is_causal=True)
    out, _ = attention.varlen_sdpa(module, q, k, k, None, **kw)
    assert out.shape == (B, L, 4, 16)
    ((qs, ks, cu, max_q, extra),) = seen
    assert qs == (B * L, 4, 16) and ks == (B * L, 2, 16)
    assert cu is kw["cu_seq_lens_q"] and cu.device.type == "meta" and max_q == batch.max_seqlen
    assert extra["window_size"] == (-1, 0) and extra["enable_gqa"] is True
    seen.clear()
    attention.varlen_sdpa(module, q, k, k, None, sliding_window=8, **kw)
    assert seen[0][4]["window_size"] == (7, 0)  # transformers: a key is seen when q - k < sliding_window


def test_packed_kernel_choice():
    cpu = torch.empty(1, 2, 4, 8)
    assert attention.packed_kernel(cpu) == "split"
    meta = torch.empty(1, 2, 4, 8, device="meta")
    assert attention.packed_kernel(meta) == "split"  # not CUDA
    desc = SDPA_PATH.describe(torch.device("cpu"))
    assert "as one SDPA call per example" in desc


def test_a_flash_attn_that_does_not_import_is_not_taken(tmp_path, monkeypatch):
    """A flash_attn wheel built for another torch is found by find_spec and fails at import (an
    undefined symbol in flash_attn_2_cuda): auto must not choose it."""
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: "
        "_ZN3c104cuda9SetDeviceEab')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    import importlib.util

    assert importlib.util.find_spec("flash_attn") is not None  # what the old check looked at
    assert attention.flash_available() is False
    from transformers import LlamaForCausalLM

    path = attention.choose("auto", LlamaForCausalLM, torch.device("cuda"))
    assert path.kernel == "sdpa" and path.padding_free


def test_without_flash_attn_installed_it_is_not_available(monkeypatch):
    real_import = builtins.__import__

    def no_flash(name, *a, **k):
        if name.startswith("flash_attn"):
            raise ModuleNotFoundError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_flash)
    assert attention.flash_available() is False


def test_collated_rows_match_the_packing():
    batch, _examples, _rows = _batch(lengths=((3, 1, 4),), pad_multiple=1)
    assert batch.seq_lens == (3, 1, 4) and not any(batch.pad_seqs)
    assert llm_data.cumulative([3, 1, 4]).tolist() == [0, 3, 4, 8]


def test_the_run_log_says_flex_compiles_on_first_use():
    """Review N7: Gemma 2 on CUDA runs flex_attention, compiled on its first call (89 s on a CPU in the
    review, 40 s more at a second length): the events line says so, so a slow first step is explained."""
    flex = attention.AttentionPath("flex", False, "auto: Gemma2ForCausalLM has no sdpa; flex_attention on CUDA")
    said = flex.describe(torch.device("cuda"))
    assert "compiled on first use" in said and "a new length" in said
    assert "compiled" not in SDPA_PATH.describe(torch.device("cuda"))
