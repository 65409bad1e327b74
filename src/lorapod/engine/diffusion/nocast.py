"""Calling a module outside autocast, in its own dtype: for the VAEs and text encoders that must not
compute in the training's autocast dtype (``engine/diffusion/__init__.py``: ``outside_autocast``)."""

from __future__ import annotations

import functools

import torch


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
