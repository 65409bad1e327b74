"""The LoRA adapter on a diffusion model: its peft config from the spec, and its injection with
the adapter's weights kept in fp32. Shared by the image and the video recipes."""

from __future__ import annotations

import contextlib

import torch

from lorapod.spec import JobSpec


def attach_lora(module: torch.nn.Module, config) -> None:
    """Inject LoRA as adapter "default" and keep its weights in fp32, whatever the base dtype
    (bf16, or float8 storage): small updates to low-precision LoRA weights would round away."""
    from peft import inject_adapter_in_model

    # peft directly (not transformers' add_adapter, which pins a newer peft); diffusers and peft
    # both read the config back from ``module.peft_config``
    inject_adapter_in_model(config, module, adapter_name="default")
    module.peft_config = {"default": config}
    for p in module.parameters():
        if p.requires_grad:
            p.data = p.data.float()


def lora_config(spec: JobSpec, targets):
    from peft import LoraConfig

    m = spec.method
    return LoraConfig(r=m.r, lora_alpha=m.alpha, lora_dropout=m.dropout, target_modules=targets,
                      use_rslora=m.rslora, init_lora_weights="gaussian")


@contextlib.contextmanager
def lora_strength(modules, strength: float):
    """Draw with every LoRA layer of ``modules`` at ``strength`` (peft's ``scaling`` times it), or
    with the adapters disabled at strength 0: the base model itself, the LoRA's path not even run
    (a scale of 0 still adds ``0 * lora_B(lora_A(x))``, and 0 * inf is NaN). Restored afterwards.
    Yields the number of LoRA layers it set, so a caller can tell that there were some."""
    from peft.tuners.lora import LoraLayer

    strength = float(strength)  # never `strength or 1.0`: 0 must stay 0 (AnimaLoraStudio #324's bug)
    layers = [m for mod in modules for m in mod.modules() if isinstance(m, LoraLayer)]
    saved = [(layer, dict(layer.scaling), layer.disable_adapters) for layer in layers]
    try:
        for layer, scaling, _ in saved:
            if strength == 0.0:
                # peft's forward reads this flag (BaseTunerLayer.disable_adapters); its
                # enable_adapters() would also flip the adapter weights' requires_grad, which the
                # training resumed after the scoring relies on
                layer._disable_adapters = True
            else:
                for name, value in scaling.items():
                    layer.scaling[name] = value * strength
        yield len(layers)
    finally:
        for layer, scaling, disabled in saved:
            layer.scaling.update(scaling)
            layer._disable_adapters = disabled
