"""The LoRA adapter on a diffusion model: its peft config from the spec, and its injection with
the adapter's weights kept in fp32. Shared by the image and the video recipes."""

from __future__ import annotations

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
