"""float8 base weights (``engine/diffusion/fp8.py``), on CPU where float8 storage and casts work:
what autograd keeps for the backward (counted with saved_tensors_hooks, the review's D2), the
scaled cast's error, gradients, and the LoRA init that must not pass through float8."""

from __future__ import annotations

import torch
from peft import LoraConfig

from lorapod.engine.diffusion.fp8 import Float8Linear, store_fp8
from lorapod.engine.diffusion.lora import attach_lora

torch.set_num_threads(1)


def _blocks(n: int = 4, d: int = 256, std: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """Frozen Linear layers named like diffusers' transformer blocks (``transformer_blocks.N``)."""
    torch.manual_seed(seed)
    m = torch.nn.Module()
    m.transformer_blocks = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(n))
    for lin in m.transformer_blocks:
        torch.nn.init.normal_(lin.weight, std=std)
    m.requires_grad_(False)
    return m


def _run(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    for lin in m.transformer_blocks:
        x = lin(x)
    return x


def _new_bytes_saved(m: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for backward that are not the module's own parameters
    or buffers (those are resident anyway): the review's D2 probe."""
    own = {t.untyped_storage().data_ptr() for t in [*m.parameters(), *m.buffers()]}
    own.add(x.untyped_storage().data_ptr())
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _run(m, x)
    out.float().square().mean().backward()
    return sum(seen.values())


def test_fp8_layers_keep_no_16_bit_weight_copy_for_the_backward():
    """G3: ``F.linear(x, w8.to(bf16))`` made a bf16 copy of every weight that autograd kept from the
    forward to the backward (4 x 256 x 256 x 2 bytes here), more than the bf16 model itself. The
    float8 layer keeps only its float8 weight and upcasts again in the backward; its input gradient
    equals the one through the dequantised weights in bf16."""
    m = _blocks()
    x = torch.randn(8, 256, dtype=torch.bfloat16, requires_grad=True)
    assert store_fp8(m) == 4
    saved = _new_bytes_saved(m, x)
    weights16 = sum(lin.weight.numel() * 2 for lin in m.transformer_blocks)
    assert saved < weights16 / 20, f"{saved} bytes of new tensors saved for backward (bf16 weights: {weights16})"
    got = x.grad.clone()
    ref = _blocks()
    for lin, q in zip(ref.transformer_blocks, m.transformer_blocks, strict=True):
        lin.weight.data = (q.weight.float() * q.weight_scale).to(torch.bfloat16)
        lin.bias.data = lin.bias.data.to(torch.bfloat16)
    x2 = x.detach().clone().requires_grad_(True)
    _run(ref, x2).float().square().mean().backward()
    assert torch.allclose(got.float(), x2.grad.float(), rtol=2e-2, atol=1e-4)


def test_fp8_under_autocast_computes_in_the_autocast_dtype():
    m = _blocks(n=1)
    store_fp8(m)
    x = torch.randn(4, 256, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _run(m, x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


def test_scaled_fp8_keeps_small_weights():
    """G20: e4m3 without a scale flushes weights of std 0.005 toward zero (15 % become 0, 11 %
    relative error: the review's D2); a per-tensor scale keeps them within 3 %."""
    m = _blocks(n=1, d=512, std=0.005)
    w = m.transformer_blocks[0].weight.detach().clone()
    x = torch.randn(16, 512)
    want = x @ w.T
    store_fp8(m)
    lin = m.transformer_blocks[0]
    assert isinstance(lin, Float8Linear) and lin.weight.dtype == torch.float8_e4m3fn
    got = torch.nn.functional.linear(x, lin.weight.float() * lin.weight_scale)
    assert (got - want).norm() / want.norm() < 0.03
    assert (lin.weight.float() == 0).float().mean() < 0.02
    with torch.no_grad():
        out = lin(x) - lin.bias
    assert (out - want).norm() / want.norm() < 0.03


def test_lora_init_is_not_rounded_through_fp8():
    """G20: peft casts a new adapter to its base layer's dtype (float8 included) after initialising
    it; the float8 layer declares fp32 as its compute dtype, so the adapter starts exactly where
    it would over a bf16 or fp32 base with the same seed."""
    def cfg():
        return LoraConfig(r=4, lora_alpha=4, target_modules=["transformer_blocks.0"], init_lora_weights="gaussian")

    plain, quant = _blocks(n=1), _blocks(n=1)
    store_fp8(quant)
    torch.manual_seed(7)
    attach_lora(plain, cfg())
    torch.manual_seed(7)
    attach_lora(quant, cfg())
    a_plain = plain.transformer_blocks[0].lora_A["default"].weight
    a_quant = quant.transformer_blocks[0].lora_A["default"].weight
    assert a_quant.dtype == torch.float32
    assert torch.equal(a_plain, a_quant)
