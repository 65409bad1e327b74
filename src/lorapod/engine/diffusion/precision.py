"""Precision rules of the diffusion engine (image and video): the families that refuse fp16, and
the VAEs and text encoders that run outside autocast, in their own dtype."""

from __future__ import annotations

import functools

import torch

from lorapod.engine.device import Precision
from lorapod.errors import SpecError


def _dtype(module: torch.nn.Module) -> torch.dtype:
    """The module's dtype as diffusers and transformers report it (``.dtype``), else its first
    floating-point parameter's."""
    dt = getattr(module, "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def wrap_outside_autocast(module: torch.nn.Module, *methods: str) -> None:
    """Replace ``module.<method>`` (on the instance) by one that turns autocast off for the
    module's device and casts floating-point tensor arguments to the module's dtype (what autocast
    did for them before: a pipeline hands a fp32 VAE its fp16 latents). Idempotent."""
    for name in methods:
        inner = getattr(module, name)
        if getattr(inner, "_outside_autocast", False):
            continue

        @functools.wraps(inner)
        def call(*args, __inner=inner, **kwargs):
            dt = _dtype(module)
            dev = next((p.device for p in module.parameters()), torch.device("cpu"))

            def cast(x):
                return x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

            with torch.autocast(dev.type, enabled=False):
                return __inner(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

        call._outside_autocast = True  # type: ignore[attr-defined]
        object.__setattr__(module, name, call)


def refuse_fp16(family, precision: Precision) -> None:
    """FLUX and Wan overflow in fp16 (their activations exceed its range; the pipelines are
    published in bf16): refuse before anything loads, rather than train on NaN."""
    if precision.compute == "fp16" and (family.flow or getattr(family, "video", False)):
        raise SpecError(f"{family.name} does not train in fp16 (it overflows to NaN)",
                        hint="use a GPU with bf16 (Ampere or newer: RTX 30xx/40xx, A100, L4, H100) and "
                             "train.precision: bf16 or auto")


def outside_autocast(vae: torch.nn.Module, encoders) -> None:
    """Run the VAE's encode/decode and the text encoders' forward with autocast off, in their own
    dtype, wherever they are called (latent and text caching, live captions, the sampling
    pipelines). Autocast casts every conv and linear to its dtype whatever the weights are, which
    undid the fp32 VAE of the fp16 path (sd-scripts' --no_half_vae; the SD/SDXL VAEs overflow in
    fp16) and T5's / umT5's fp32 ``wo`` layers (transformers' ``_keep_in_fp32_modules``)."""
    wrap_outside_autocast(vae, "encode", "decode")
    for te in encoders:
        if te is not None:
            wrap_outside_autocast(te, "forward")
