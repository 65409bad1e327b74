"""Qwen-Image's transformer as the planner counts it (catalog/data/models.yaml ``qwenimage`` rows:
``token_params_b``, ``kernels_per_fwd``, ``traffic_mb_per_token``): diffusers'
``QwenImageTransformer2DModel`` with its defaults (the published config: 60 blocks, 24 heads x 128,
joint_attention_dim 3584) on the meta device, rank-16 LoRA on the attention projections, one 1024 px
image (4096 packed tokens) and 512 caption tokens. ``bench/derive_architecture.py`` prints the figures."""

from __future__ import annotations

from typing import Any

IMAGE_TOKENS = 4096
TEXT_TOKENS = 512


def dit() -> tuple[Any, Any, int]:
    """(model, forward, tokens a linear sees) for plan/counted_models.py's ``count_dit``."""
    import torch
    from diffusers import QwenImageTransformer2DModel
    from peft import LoraConfig

    from lorapod.plan.counted_models import ATTENTION_LORA_TARGETS, bf16_on_meta

    with bf16_on_meta():
        model = QwenImageTransformer2DModel()
        model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=ATTENTION_LORA_TARGETS))
        hs = torch.empty(1, IMAGE_TOKENS, 64)
        text = torch.empty(1, TEXT_TOKENS, 3584)
        mask = torch.ones(1, TEXT_TOKENS)
        t = torch.full((1,), 0.5)
    return model, (lambda: model(hidden_states=hs, encoder_hidden_states=text, encoder_hidden_states_mask=mask,
                                 timestep=t, img_shapes=[[(1, 64, 64)]]).sample), IMAGE_TOKENS + TEXT_TOKENS
