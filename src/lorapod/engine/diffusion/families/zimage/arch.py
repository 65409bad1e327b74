"""Z-Image's transformer as the planner counts it (catalog/data/models.yaml ``zimage`` rows:
``token_params_b``, ``kernels_per_fwd``, ``traffic_mb_per_token``): diffusers'
``ZImageTransformer2DModel`` with its defaults (the published config: dim 3840, 30 layers, 30 heads,
cap_feat_dim 2560) on the meta device, rank-16 LoRA on the attention projections, one 1024 px image
(4096 latent tokens) and 512 caption tokens. ``bench/derive_architecture.py`` prints the figures."""

from __future__ import annotations

from typing import Any

IMAGE_TOKENS = 4096  # 1024 px: 128 x 128 latents in 2 x 2 patches
TEXT_TOKENS = 512


def dit() -> tuple[Any, Any, int]:
    """(model, forward, tokens a linear sees) for plan/counted_models.py's ``count_dit``."""
    import torch
    from diffusers import ZImageTransformer2DModel
    from peft import LoraConfig

    from lorapod.plan.counted_models import ATTENTION_LORA_TARGETS, bf16_on_meta

    with bf16_on_meta():
        model = ZImageTransformer2DModel()
        model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=ATTENTION_LORA_TARGETS))
        x = [torch.empty(16, 1, 128, 128)]
        cap = [torch.empty(TEXT_TOKENS, 2560)]
        t = torch.full((1,), 0.5)
    return model, (lambda: model(x, t, cap, return_dict=False)[0][0]), IMAGE_TOKENS + TEXT_TOKENS
