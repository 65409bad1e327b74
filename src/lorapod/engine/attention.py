"""Which attention kernel the LLM recipe runs, and how a packed row reaches it without an L x L mask.

``train.attention`` (auto | sdpa | flex | flash | eager) picks the kernel; :func:`choose` turns it
and the loaded model into an :class:`AttentionPath`. Packed rows are *padding-free* on every path
that a transformers model class supports: the decoder gets ``attention_mask=None`` and
``position_ids`` that restart at every example, never a (B, 1, L, L) tensor of lorapod's.

What each kernel does with such a row (transformers 5.24, torch 2.13):

- ``sdpa``: lorapod's own attention function (registered with transformers as ``lorapod_sdpa``,
  :func:`varlen_sdpa`): each example of a row runs ``scaled_dot_product_attention`` on its own
  slice with ``is_causal=True``, so no mask is built, nothing L x L is kept for the backward,
  cross-example blocks cost nothing, and on CUDA the flash kernel may run. Transformers' own sdpa
  path would find the packed examples from the position ids too
  (``transformers/masking_utils.py:735-764`` ``find_packed_sequence_indices``, called at
  ``:862-871`` only when the 2-D mask is None and no cache is given), but it then builds a dense
  boolean (B, 1, L, L) mask (``masking_utils.py:991-1014`` -> ``sdpa_mask``) that SDPA converts to
  a float copy per layer and keeps for the backward (the review's D4; ``tests/test_engine_llm_attention.py``
  counts it). Sliding windows (Mistral, Qwen2's sliding layers) arrive as the ``sliding_window``
  argument transformers' attention modules pass (``models/qwen2/modeling_qwen2.py:221``,
  ``models/mistral/modeling_mistral.py:173``) and become a banded mask on the examples longer
  than the window only.
- ``flex``: transformers' ``flex_attention`` with the same position ids: ``flex_attention_mask``
  (``masking_utils.py:664-718``) turns the packed-document mask into a ``BlockMask`` that skips
  every block outside the examples' causal triangles. CUDA only (FlexAttention has no CPU backward).
- ``flash``: ``flash_attention_2`` (the ``flash_attn`` package, CUDA only). Transformers derives
  ``cu_seqlens`` from the position ids only for a batch of one row
  (``modeling_flash_attention_utils.py:564-580`` ``_is_packed_sequence``), so the micro-batch is
  flattened into one row without its padding (:func:`prepare_batch`).
- ``eager``: transformers' eager attention with the same position ids: ``eager_mask``
  (``masking_utils.py:552-618``) builds the *additive* float mask (0 / finfo.min) itself, sliding
  windows included. Eager keeps the (B, H, L, L) attention probabilities per layer anyway; it is
  for models whose class declares no sdpa (Gemma 2: ``_supports_sdpa = False`` because SDPA has no
  logit soft-capping, ``models/gemma2/modeling_gemma2.py:353``).

A model whose code is not transformers' own (``trust_remote_code``) may ignore restarting position
ids, which would let examples see each other silently; such a model gets lorapod's explicit
additive mask (:func:`additive_mask`, 0 / finfo.min in the compute dtype, built once per step so
SDPA does not convert it per layer) and its rows are padded to a multiple of 64 on CUDA, the
alignment SDPA's memory-efficient kernel wants for a bias.
"""

from __future__ import annotations

import importlib.util
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lorapod.errors import HardwareError, SpecError

# transformers' names for each kernel of train.attention
HF_NAMES = {"sdpa": "sdpa", "flex": "flex_attention", "flash": "flash_attention_2", "eager": "eager"}
LORAPOD_SDPA = "lorapod_sdpa"
_SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flex": "_supports_flex_attn", "flash": "_supports_flash_attn"}


@dataclass(frozen=True)
class AttentionPath:
    """What the recipe runs: the kernel, whether an explicit (B, 1, L, L) mask goes with it, and why."""

    kernel: str  # sdpa | flex | flash | eager
    explicit_mask: bool  # True: lorapod's additive (B, 1, L, L) mask (a model with its own code)
    why: str

    @property
    def hf_name(self) -> str:
        """The ``attn_implementation`` the model runs with."""
        if self.kernel == "sdpa" and not self.explicit_mask:
            return LORAPOD_SDPA
        return HF_NAMES[self.kernel]

    @property
    def padding_free(self) -> bool:
        return not self.explicit_mask

    def pad_multiple(self, device: torch.device) -> int:
        """Rows are padded to this many tokens: 64 on CUDA with a mask (SDPA's bias alignment, tensor
        cores; review G18), 8 on CUDA without one, none on the CPU."""
        if device.type != "cuda":
            return 1
        return 64 if self.explicit_mask else 8

    def describe(self, device: torch.device | None = None) -> str:
        mask = "explicit additive (B,1,L,L) mask" if self.explicit_mask else "padding-free (restarting position ids)"
        how = ""
        if self.kernel == "sdpa" and not self.explicit_mask and device is not None:
            how = (" on torch's varlen_attn (one FlashAttention kernel per layer)"
                   if device.type == "cuda" and varlen_available()
                   else " as one SDPA call per example (this torch has no varlen_attn for this device)")
        elif self.kernel == "flex" and device is not None and device.type == "cuda":
            how = "; flex_attention is compiled on first use: the first steps (and the first at a new length) " \
                  "include its compile, a minute or more"
        return f"attention: {self.kernel}{how}, {mask} ({self.why})"


def flash_available() -> bool:
    """flash_attn imports and its CUDA extension loads (review N8): a wheel built for another torch
    is found by ``find_spec`` but fails at import with an undefined symbol, and ``auto`` must then
    take another path, not crash. transformers' own check (``is_flash_attn_2_available``) looks at
    the version only, so the import is done here."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401
        from flash_attn import flash_attn_varlen_func  # noqa: F401  (loads flash_attn_2_cuda)
    except Exception:  # ImportError, OSError (undefined symbol), RuntimeError: not usable here
        return False
    return True


def varlen_available() -> bool:
    """torch's own FlashAttention varlen kernel with autograd (``torch.nn.attention.varlen``; torch
    2.7 and 2.8 do not have it): CUDA only, fp16/bf16, head dims up to 256."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def packed_kernel(query: torch.Tensor, dropout: float = 0.0) -> str:
    """What :func:`varlen_sdpa` runs a packed micro-batch on: ``varlen_attn`` (one kernel for all the
    examples) where torch has it and it takes these tensors, else ``split`` (one SDPA per example)."""
    if (query.device.type == "cuda" and varlen_available() and query.dtype in (torch.float16, torch.bfloat16)
            and query.shape[-1] <= 256 and not dropout):
        return "varlen_attn"
    return "split"


def flex_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def supports(model_cls: type, kernel: str) -> bool:
    """Whether a transformers model class declares ``kernel`` (eager: always)."""
    if kernel == "eager":
        return True
    return bool(getattr(model_cls, _SUPPORT_FLAG[kernel], False))


def native(model_cls: type) -> bool:
    """A model class of transformers itself (its masks come from ``masking_utils``), not remote code
    (whose module is ``transformers_modules.<repo>``)."""
    return model_cls.__module__.startswith("transformers.")


def load_name(requested: str) -> str | None:
    """The ``attn_implementation`` to load the model with; None for auto (transformers then takes
    sdpa where the class supports it and eager otherwise, ``modeling_utils.py:1855-1890``)."""
    return None if requested == "auto" else HF_NAMES[requested]


def choose(requested: str, model_cls: type, device: torch.device, *, flash: bool | None = None,
           flex: bool | None = None) -> AttentionPath:
    """The attention path for ``train.attention`` = ``requested`` on ``model_cls`` and ``device``.

    auto: flash where ``flash_attn`` is installed, on CUDA, for a class that supports it; else sdpa
    where the class supports it; else flex on CUDA (Triton installed); else eager. An explicit
    choice the class or the device cannot run is a SpecError / HardwareError naming what can."""
    cuda = device.type == "cuda"
    flash = flash_available() if flash is None else flash
    flex = flex_available() if flex is None else flex
    explicit = not native(model_cls)
    name = model_cls.__name__
    if requested == "auto":
        if cuda and flash and supports(model_cls, "flash") and not explicit:
            return AttentionPath("flash", False, "auto: flash_attn installed, CUDA, supported by " + name)
        if supports(model_cls, "sdpa"):
            why = "auto: " + (f"{name} is remote code, so its packed rows get an explicit mask" if explicit
                              else f"{name} supports sdpa")
            return AttentionPath("sdpa", explicit, why)
        if cuda and flex and supports(model_cls, "flex") and not explicit:
            return AttentionPath("flex", False, f"auto: {name} has no sdpa; flex_attention on CUDA")
        return AttentionPath("eager", explicit, f"auto: {name} declares no sdpa support")
    check_device(requested, device, flash=flash, flex=flex)
    if not supports(model_cls, requested):
        can = ", ".join(k for k in ("sdpa", "flex", "flash", "eager") if supports(model_cls, k))
        raise SpecError(f"{name} does not support train.attention {requested}",
                        hint=f"it supports: {can}; or leave train.attention at auto")
    if explicit and requested in ("flex", "flash"):
        raise SpecError(f"train.attention {requested} needs a transformers model class; {name} is remote code",
                        hint="use sdpa or eager (lorapod then builds the packing mask itself)")
    return AttentionPath(requested, explicit, f"train.attention: {requested}")


def check_device(requested: str, device: torch.device, *, flash: bool | None = None,
                 flex: bool | None = None) -> None:
    """Refuse, before anything is loaded, a kernel this machine cannot run."""
    if requested not in (*HF_NAMES, "auto"):
        raise SpecError(f"train.attention '{requested}' is not one of auto, sdpa, flex, flash, eager")
    if requested in ("flex", "flash") and device.type != "cuda":
        raise HardwareError(f"train.attention {requested} runs on CUDA GPUs only (this job runs on {device.type})",
                            hint="leave train.attention at auto (padding-free sdpa on this machine)")
    if requested == "flash" and not (flash_available() if flash is None else flash):
        raise HardwareError("train.attention flash needs the flash_attn package, which is not installed",
                            hint="pip install flash-attn, or leave train.attention at auto")
    if requested == "flex" and not (flex_available() if flex is None else flex):
        raise HardwareError("train.attention flex needs Triton (torch's flex_attention compiles with it)",
                            hint="install triton, or leave train.attention at auto")


def install(model: Any, path: AttentionPath) -> None:
    """Switch the loaded model to ``path``'s implementation (lorapod's varlen SDPA for sdpa)."""
    register()
    if getattr(model.config, "_attn_implementation", None) != path.hf_name:
        model.set_attn_implementation(path.hf_name)


# ----------------------------------------------------------------------------- batches


def prepare_batch(batch, path: AttentionPath):
    """The batch the decoder gets on ``path``: flash runs one flattened row without padding (see
    the module doc). Called on the CPU batch (its padding is known there without a read-back)."""
    if path.kernel == "flash" and (batch.input_ids.shape[0] > 1 or any(batch.pad_seqs)
                                   or (not batch.seq_lens and bool((batch.segment_ids < 0).any()))):
        return batch.flattened()
    return batch


def forward_kwargs(batch, path: AttentionPath, dtype: torch.dtype) -> dict:
    """``attention_mask`` and ``position_ids`` for the decoder: padding-free, None and the restarting
    positions; with an explicit mask, the additive (B, 1, L, L) mask in ``dtype``. Padding-free sdpa
    and flash also get the sequence boundaries collate computed on the CPU (``cu_seq_lens_q/k``,
    ``max_length_q/k``, the names of transformers' ``FlashAttentionKwargs``): transformers' flash path
    then does not derive them from the position ids in every layer, a device sync each time (its own
    docstring, ``modeling_flash_attention_utils.py``; review N8), and lorapod's varlen path uses them."""
    mask = additive_mask(batch.segment_ids, dtype) if path.explicit_mask else None
    out = {"attention_mask": mask, "position_ids": batch.position_ids}
    cu = getattr(batch, "cu_seqlens", None)
    if path.padding_free and path.kernel in ("sdpa", "flash") and cu is not None:
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=batch.max_seqlen, max_length_k=batch.max_seqlen)
        _lengths[0] = (weakref.ref(cu), list(batch.seq_lens))
    return out


def additive_mask(segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, L, L): 0 where token i may see token j (same example, j <= i), ``finfo(dtype).min``
    elsewhere. Padding (segment -1) sees itself, so no row is empty (no NaN). Eager attention adds
    it to the scores (``attn_weights + attention_mask``); SDPA takes it as a float bias as it is."""
    seg = segment_ids
    L = seg.shape[1]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
    causal = torch.ones(L, L, dtype=torch.bool, device=seg.device).tril()
    eye = torch.eye(L, dtype=torch.bool, device=seg.device)
    allowed = (same & causal) | (eye & (seg[:, :, None] < 0))
    zero = torch.zeros((), dtype=dtype, device=seg.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


# ----------------------------------------------------------------------------- varlen SDPA


_last: tuple[Any, list[list[tuple[int, int]]]] | None = None  # (weakref to position_ids, its spans)


def spans(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the (start, end) of each example: a new one starts wherever a position is not its
    predecessor + 1 (the rule of transformers' ``find_packed_sequence_indices``). Padding (position
    0 after position 0) makes one-token spans. Every layer of a forward gets the same position_ids
    tensor: its spans are read from the device once (one sync), not once per layer."""
    global _last
    if _last is not None and _last[0]() is position_ids:
        return _last[1]
    out = _spans(position_ids)
    _last = (weakref.ref(position_ids), out)
    return out


def _spans(pos: torch.Tensor) -> list[list[tuple[int, int]]]:
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    out = []
    L = pos.shape[1]
    for row in starts.cpu().tolist():
        idx = [i for i, s in enumerate(row) if s]
        out.append(list(zip(idx, [*idx[1:], L], strict=True)))
    return out


def _window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    i = torch.arange(n, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)  # transformers: kv_idx > q_idx - sliding_window


def varlen_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                sliding_window: int | None = None, is_causal=None, **kwargs):
    """transformers attention function for packed rows: every example attends to itself only.

    Runs only on the padding-free training call (no mask, no cache, one query per key, position
    ids given); anything else (generation, a mask, cross-attention, Gemma 2's soft-capping) is
    transformers' own sdpa. Query (B, H, L, D), key/value (B, KV, L, D); returns (B, L, H, D) as
    transformers' functions do. The B x L tokens are one flat list of sequences (``cu_seq_lens_q``
    from collate, else found from the position ids), and run as (review N3):

    - ``varlen_attn``: torch's FlashAttention varlen kernel (``torch.nn.attention.varlen``), one
      call per layer with autograd, GQA and sliding windows, on CUDA where torch has it;
    - ``split``: elsewhere (the CPU, torch 2.7/2.8, fp32, dropout), one ``scaled_dot_product_attention``
      per example on pieces of ``torch.split``, whose backward is one ``cat``. The loop of slices it
      replaces wrote a full-size zero tensor per example in its backward: 5.2 GB and 1,134 kernels for
      one Qwen2.5-0.5B layer at 4 x 2,048 tokens (bench/attention_ops.py, docs/performance.md).
    One-token sequences (padding of one) attend to themselves only: their output is their value."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (attention_mask is not None or position_ids is None or not causal or query.shape[2] != key.shape[2]
            or query.shape[2] == 1 or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    B, H, L, D = query.shape
    kv = key.shape[1]
    p = dropout if module.training else 0.0
    cu = kwargs.get("cu_seq_lens_q")
    lengths = _lengths_for(cu, position_ids, B)
    # (T, heads, D): the layout of varlen kernels, B x L tokens end to end
    q, k, v = (t.transpose(1, 2).reshape(B * L, t.shape[1], t.shape[-1]) for t in (query, key, value))
    window = sliding_window if sliding_window and max(lengths) > sliding_window else None
    if packed_kernel(query, p) == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn

        if cu is None or cu.device != query.device:
            cu = _cumulative(lengths, query.device)
        out = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), scale=scaling,
                          window_size=(window - 1, 0) if window else (-1, 0), enable_gqa=kv != H)
        return out.reshape(B, L, H, D), None
    pieces = []
    rep = H // kv
    for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        n = qs.shape[0]
        if n == 1:  # attends to itself: its value
            pieces.append(vs.repeat_interleave(rep, dim=1) if rep > 1 else vs)
            continue
        qh, kh, vh = qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None]
        banded = bool(window and n > window)
        # CPU and CUDA fused kernels take GQA only without a mask and with head dims <= 256; otherwise
        # K/V are repeated, as transformers does (integrations/sdpa_attention.py:42-51)
        gqa = rep > 1 and not banded and kh.shape[-1] == vh.shape[-1] <= 256
        if rep > 1 and not gqa:
            kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        if banded:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=_window_mask(n, window, qh.device),  # type: ignore[arg-type]
                                               dropout_p=p, scale=scaling)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, dropout_p=p, is_causal=True, scale=scaling,
                                               enable_gqa=gqa)
        pieces.append(o[0].transpose(0, 1))
    out = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]
    return out.reshape(B, L, H, out.shape[-1]), None


#: The CPU lengths of the last ``cu_seqlens`` forward_kwargs handed out, by a weak reference to
#: that tensor: every layer of a forward gets it, and its lengths are known without a read-back.
_lengths: list[tuple[Any, list[int]] | None] = [None]


def _lengths_for(cu: torch.Tensor | None, position_ids: torch.Tensor, rows: int) -> list[int]:
    """The flat sequence lengths of a forward: from collate's CPU copy when ``cu`` is the tensor it
    built, else from ``cu`` (read once per forward), else from the position ids (:func:`spans`)."""
    known = _lengths[0]
    if cu is not None:
        if known is not None and known[0]() is cu:
            return known[1]
        out = cu.diff().tolist()
        _lengths[0] = (weakref.ref(cu), out)
        return out
    per_row = spans(position_ids)
    if len(per_row) != rows:  # position ids given once for the whole batch
        per_row = per_row[:1] * rows
    return [e - s for row in per_row for s, e in row]


def _cumulative(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths).cumsum(0)
    return out.to(device)


_registered = False


def register() -> None:
    """Make ``lorapod_sdpa`` a transformers attention implementation. Its mask function builds no
    mask for the padding-free training call (the attention function finds the examples itself)
    and is transformers' ``sdpa_mask`` for everything else (generation with a padding mask)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kw):
        if attention_mask is None and q_length == kv_length and not q_offset and not kv_offset and q_length > 1:
            return None
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, attention_mask=attention_mask, **kw)

    AttentionInterface.register(LORAPOD_SDPA, varlen_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(LORAPOD_SDPA, mask)
    _registered = True
