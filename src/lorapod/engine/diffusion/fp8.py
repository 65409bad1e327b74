"""float8 storage for a frozen base: the Linear weights of the transformer blocks kept in float8
(half of bf16) with a per-tensor scale, and upcast to the compute dtype per call. One rule for the
image families and Wan; only the blocks' names differ (``transformer_blocks.`` in diffusers' image
models, ``blocks.N`` in Wan's transformer).

Memory: the upcast copy lives only while its matmul runs. ``_Fp8Linear`` saves the float8 weight
(resident anyway) for the backward and upcasts it again there, so autograd keeps no 16-bit copy of
any weight between forward and backward, with or without gradient checkpointing (a plain
``F.linear(x, w8.to(dtype))`` would keep one per layer: 1 + 2 bytes a weight, more than bf16's 2).

Precision: weights are divided by a per-tensor scale (the power of two at or above the largest
magnitude over e4m3's largest finite value, 448) before the cast, as musubi-tuner's ``--fp8_scaled`` does, so small weights keep
e4m3's mantissa instead of flushing toward zero (its smallest normal is 2^-6): for Gaussian
weights of std 0.005, 11 % relative error unscaled, under 3 % scaled.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, fp32 scale) with ``w ~= w8.float() * scale``. The scale is the power of two
    at or above amax / 448: exact in bf16 and fp16 too, so the upcast's multiply rounds nothing."""
    amax = w.detach().abs().amax().float().clamp(min=torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    return (w.detach().float() / scale).to(FP8), scale


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


class _Fp8Linear(torch.autograd.Function):
    """``x @ (w8 * scale).T + b`` for a frozen float8 weight: the 16-bit weight exists only inside
    forward and backward (the gradient is for ``x`` alone; weight, scale and bias are frozen)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        dt = _compute_dtype(x)
        ctx.save_for_backward(w8, scale)
        ctx.x_dtype = x.dtype
        ctx.dt = dt
        with torch.autocast(x.device.type, enabled=False):
            w = w8.to(dt) * scale.to(dt)
            return torch.nn.functional.linear(x.to(dt), w, None if bias is None else bias.to(dt))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        w8, scale = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        with torch.autocast(grad.device.type, enabled=False):
            w = w8.to(ctx.dt) * scale.to(ctx.dt)
            gx = grad.to(ctx.dt) @ w
        return gx.to(ctx.x_dtype), None, None, None


class Float8Linear(torch.nn.Linear):
    """A frozen Linear whose weight is stored in float8 with a per-tensor scale (``weight_scale``)
    and upcast per call (``_Fp8Linear``). diffusers' layerwise casting casts back in place after
    the forward, which breaks the backward pass; it is made for inference.

    ``compute_dtype``: the dtype peft gives the LoRA layers it injects around this one (peft 0.21.2,
    ``tuners_utils.py``: ``_get_base_layer_device_and_dtype`` reads ``compute_dtype`` before the
    weight's dtype, then ``_move_adapter_to_device_of_base_layer`` casts the new, initialised adapter
    to it): fp32, so the adapters' initial weights are not rounded through float8."""

    compute_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8Linear.apply(x, self.weight, self.weight_scale, self.bias)


def _in_transformer_blocks(name: str) -> bool:
    return "transformer_blocks." in name


def store_fp8(denoiser: torch.nn.Module, in_block: Callable[[str], bool] = _in_transformer_blocks) -> int:
    """Store the frozen Linear weights of the transformer blocks in float8 (half of bf16) with a
    per-tensor scale; returns how many. Called before LoRA is attached. Embeddings, projections in
    and out, norms and convolutions keep their dtype: they are small, precision-sensitive, and the
    first of them tells diffusers the model's dtype (pipelines allocate latents in it).
    ``in_block``: whether a module's name is inside a block (the image models' rule by default)."""
    n = 0
    for name, mod in denoiser.named_modules():
        if type(mod) is torch.nn.Linear and in_block(name):
            w8, scale = quantize(mod.weight.data)
            mod.weight.data = w8
            mod.register_buffer("weight_scale", scale.to(mod.weight.device))
            mod.__class__ = Float8Linear
            n += 1
    return n
