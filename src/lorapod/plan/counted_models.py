"""The diffusion architectures the planner knows, built from their published configs on torch's
``meta`` device, and the catalog figures counted on them (plan/step_count.py's counters).

SD 1.5 / SDXL: activation memory, forward and VAE-encode FLOPs, kernels per forward. The DiTs
(FLUX.1, FLUX.2 klein, Wan): the parameters each token's matmuls pass through, and kernels.
``bench/derive_architecture.py`` prints them next to what ``catalog/data/models.yaml`` holds;
tests/test_plan_step_count.py requires the two to be equal, so the catalog cannot drift from the
architectures. The LLM figures (the Llama layer, the trainers' losses, GPTQ) are counted in
plan/counted_llm.py. Needs torch, diffusers and peft: a development tool, never imported by
``lorapod plan``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from lorapod.plan.step_count import (
    MATMULS,
    ForwardCount,
    StepMemory,
    Traffic,
    count_forward,
    count_step,
    fused_attention,
)

# LoRA on the attention projections, as diffusers' and SimpleTuner's LoRA scripts attach it
# (present in every U-Net transformer block and every DiT block of the three families).
ATTENTION_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


@contextlib.contextmanager
def bf16_on_meta() -> Iterator[None]:
    """Modules and tensors made inside live on ``meta`` in bf16: the weights and inputs a bf16
    step moves, without memory."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.set_default_dtype(default)


# ----------------------------------------------------------------------------- the U-Nets

# The published diffusers configs of the two U-Nets (unet/config.json of
# stable-diffusion-v1-5/stable-diffusion-v1-5 and stabilityai/stable-diffusion-xl-base-1.0); the
# keys left out are diffusers' defaults.
UNET_CONFIGS: dict[str, dict[str, Any]] = {
    "sd15": {"cross_attention_dim": 768, "attention_head_dim": 8, "sample_size": 64},
    "sdxl": {
        "block_out_channels": (320, 640, 1280),
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        "transformer_layers_per_block": (1, 2, 10),
        "attention_head_dim": (5, 10, 20),
        "cross_attention_dim": 2048,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816,
        "use_linear_projection": True,
        "sample_size": 128,
    },
}


def _unet(family: str, resolution: int, batch: int, rank: int, checkpointing: bool) -> Any:
    """The U-Net with LoRA on ``meta`` and a forward over cached latents / text embeddings."""
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    config = UNET_CONFIGS[family]
    with bf16_on_meta():
        unet = UNet2DConditionModel(**config)
        unet.requires_grad_(False)
        unet.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=ATTENTION_LORA_TARGETS))
        if checkpointing:
            unet.enable_gradient_checkpointing()
        unet.train()
        side = resolution // 8
        latents = torch.empty(batch, 4, side, side)
        text = torch.empty(batch, 77, config["cross_attention_dim"])
        extra: dict[str, Any] = {}
        if family == "sdxl":  # pooled text embedding and the size / crop conditioning
            extra["added_cond_kwargs"] = {"text_embeds": torch.empty(batch, 1280), "time_ids": torch.empty(batch, 6)}
        timesteps = torch.full((batch,), 500)

    def forward() -> torch.Tensor:
        pred = unet(latents, timesteps, text, **extra).sample
        return (pred.float() - latents.float()).pow(2).mean()

    return unet, forward


def unet_step(family: str, resolution: int, *, checkpointing: bool, batch: int = 1, rank: int = 16) -> StepMemory:
    """Activation memory of one bf16 LoRA step of the SD 1.5 / SDXL U-Net at ``resolution`` px
    (cached latents and text embeddings: only the U-Net runs)."""
    unet, forward = _unet(family, resolution, batch, rank, checkpointing)
    return count_step(unet, forward)


def unet_forward(family: str, resolution: int, *, rank: int = 16) -> ForwardCount:
    """FLOPs and kernels of one U-Net forward (batch 1) at ``resolution`` px, LoRA attached."""
    _unet_model, forward = _unet(family, resolution, 1, rank, checkpointing=False)
    return count_forward(forward)


# The Stable Diffusion VAE (vae/config.json of SD 1.5 and SDXL: the same architecture).
SD_VAE_CONFIG: dict[str, Any] = {
    "block_out_channels": (128, 256, 512, 512),
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "latent_channels": 4,
    "layers_per_block": 2,
}


# FLUX.1's VAE (vae/config.json of black-forest-labs/FLUX.1-dev): the same encoder, 16 latent channels.
FLUX1_VAE_CONFIG: dict[str, Any] = {**SD_VAE_CONFIG, "latent_channels": 16, "use_quant_conv": False,
                                    "use_post_quant_conv": False}


def vae_encode(resolution: int, config: dict[str, Any] = SD_VAE_CONFIG) -> ForwardCount:
    """FLOPs of encoding one image to latents (when latents are not cached)."""
    from diffusers import AutoencoderKL

    with bf16_on_meta():
        vae = AutoencoderKL(**config)
        image = torch.empty(1, 3, resolution, resolution)
    return count_forward(lambda: vae.encode(image).latent_dist.mean)


# The compute-bound operators, timed by their FLOPs: what the memory-bound traffic leaves out.
COMPUTE_BOUND = (*MATMULS, "convolution.default", "convolution_backward.default")


def memory_bound_traffic(forward: Any) -> tuple[float, float]:
    """Bytes (GB) the operators other than matmuls, convolutions and fused attention move in one
    forward and in the backward that follows (input gradients, the base frozen): norms, their
    float32 casts, activations, modulation, rotary embedding, residual adds, the LoRA branch's
    scale and add. Eager PyTorch runs each as its own kernel, each bounded by memory bandwidth."""
    moved = Traffic(skip=COMPUTE_BOUND)
    with fused_attention(), moved:
        out = forward()
        out = out.sample if hasattr(out, "sample") else out[0] if isinstance(out, tuple) else out
        done = moved.bytes
        out.backward(torch.empty_like(out))
    return done / 1e9, (moved.bytes - done) / 1e9


def unet_figures(family: str, resolution: int) -> dict[str, float]:
    """The catalog's U-Net figures at ``resolution``, counted (models.yaml keys; see the module)."""
    fwd = unet_forward(family, resolution)
    traffic = memory_bound_traffic(_unet(family, resolution, 1, 16, checkpointing=False)[1])
    return {
        "fwd_tflops_at_ref": round(fwd.tflops, 2),
        "attn_tflops_at_ref": round(fwd.attention_tflops, 3),
        "kernels_per_fwd": fwd.kernels,
        "vae_encode_tflops_at_ref": round(vae_encode(resolution).tflops, 2),
        "activations_gb_at_ref.checkpointing": round(unet_step(family, resolution, checkpointing=True).peak_gib, 2),
        "activations_gb_at_ref.no_checkpointing": round(unet_step(family, resolution, checkpointing=False).peak_gib, 2),
        "traffic_gb_at_ref.forward": round(traffic[0], 2),
        "traffic_gb_at_ref.backward": round(traffic[1], 2),
    }


# ----------------------------------------------------------------------------- diffusion transformers

# diffusers configs of the catalog's DiTs (the keys left out are the classes' defaults, which are
# FLUX.1's and Wan2.1's): FLUX.2 klein from its published transformer config (as models.yaml
# notes), Wan from each model's config.json. Wan2.1 I2V 14B and Wan2.2 A14B's experts have the
# T2V 14B transformer's shape.
DIT_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "flux1": ("flux1", {"num_layers": 19, "num_single_layers": 38, "guidance_embeds": True}),
    "flux2-klein-4b": ("flux2", {"num_layers": 5, "num_single_layers": 20, "num_attention_heads": 24,
                                 "joint_attention_dim": 7680}),
    "flux2-klein-9b": ("flux2", {"num_layers": 8, "num_single_layers": 24, "num_attention_heads": 32,
                                 "joint_attention_dim": 12288}),
    "wan21-1.3b": ("wan", {"num_layers": 30, "num_attention_heads": 12, "ffn_dim": 8960}),
    "wan21-14b": ("wan", {"num_layers": 40, "num_attention_heads": 40, "ffn_dim": 13824}),
    "wan22-ti2v-5b": ("wan", {"num_layers": 30, "num_attention_heads": 24, "ffn_dim": 14336, "in_channels": 48,
                              "out_channels": 48}),
}
TEXT_TOKENS = 512
FLUX_IMAGE_TOKENS = 4096  # 1024 px
WAN_LATENT = (21, 30, 52)  # 81 frames at 832x480


def _dit(key: str) -> Any:
    """The DiT on ``meta`` with LoRA, its forward, and the tokens that pass through its linears."""
    from peft import LoraConfig

    family, config = DIT_CONFIGS[key]
    with bf16_on_meta():
        if family == "flux1":
            from diffusers import FluxTransformer2DModel

            model = FluxTransformer2DModel(**config)
            img = torch.empty(1, FLUX_IMAGE_TOKENS, 64)
            kwargs = {"encoder_hidden_states": torch.empty(1, TEXT_TOKENS, 4096),
                      "pooled_projections": torch.empty(1, 768), "guidance": torch.full((1,), 3.5),
                      "img_ids": torch.zeros(FLUX_IMAGE_TOKENS, 3), "txt_ids": torch.zeros(TEXT_TOKENS, 3)}
            tokens = FLUX_IMAGE_TOKENS + TEXT_TOKENS  # joint attention: text tokens run the blocks too
        elif family == "flux2":
            from diffusers import Flux2Transformer2DModel

            model = Flux2Transformer2DModel(patch_size=1, in_channels=128, attention_head_dim=128, mlp_ratio=3.0,
                                            timestep_guidance_channels=256, axes_dims_rope=(32, 32, 32, 32),
                                            guidance_embeds=False, **config)
            img = torch.empty(1, FLUX_IMAGE_TOKENS, 128)
            kwargs = {"encoder_hidden_states": torch.empty(1, TEXT_TOKENS, config["joint_attention_dim"]),
                      "img_ids": torch.zeros(1, FLUX_IMAGE_TOKENS, 4), "txt_ids": torch.zeros(1, TEXT_TOKENS, 4)}
            tokens = FLUX_IMAGE_TOKENS + TEXT_TOKENS
        else:
            from diffusers import WanTransformer3DModel

            model = WanTransformer3DModel(attention_head_dim=128, text_dim=4096, freq_dim=256, cross_attn_norm=True,
                                          qk_norm="rms_norm_across_heads", **config)
            frames, h, w = WAN_LATENT
            img = torch.empty(1, model.config.in_channels, frames, h * 2, w * 2)  # 2x2 patches
            kwargs = {"encoder_hidden_states": torch.empty(1, TEXT_TOKENS, 4096)}
            tokens = frames * h * w  # the text only meets the image in cross-attention
        model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=ATTENTION_LORA_TARGETS))
        timestep = torch.full((1,), 500.0)
    return model, (lambda: model(hidden_states=img, timestep=timestep, **kwargs)), tokens


def count_dit(model_forward_tokens: tuple[Any, Any, int]) -> dict[str, float]:
    """``dit_figures`` for a DiT a family's own folder builds (``engine/diffusion/families/<name>/arch.py``
    ``dit()``: model, forward, tokens), so a new family adds no branch here."""
    _model, forward, tokens = model_forward_tokens
    count = count_forward(forward)
    linear = (count.tflops - count.attention_tflops) * 1e12
    fwd, bwd = memory_bound_traffic(forward)
    return {"token_params_b": round(linear / (2 * tokens) / 1e9, 2), "kernels_per_fwd": count.kernels,
            "traffic_mb_per_token.forward": round(fwd * 1e3 / tokens, 1),
            "traffic_mb_per_token.backward": round(bwd * 1e3 / tokens, 1)}


def dit_figures(key: str) -> dict[str, float]:
    """The catalog's DiT figures, counted: parameters each token's matmuls pass through (a
    double-stream block gives image and text tokens weights of their own, and adaLN modulation
    runs once a sample, not a token, so this is well below the parameter count for FLUX),
    operators per forward, and the memory-bound operators' traffic per token (MB, forward and
    backward; linear in the tokens, since fused attention keeps no score matrix)."""
    _model, forward, tokens = _dit(key)
    count = count_forward(forward)
    linear = (count.tflops - count.attention_tflops) * 1e12
    fwd, bwd = memory_bound_traffic(forward)
    return {"token_params_b": round(linear / (2 * tokens) / 1e9, 2), "kernels_per_fwd": count.kernels,
            "traffic_mb_per_token.forward": round(fwd * 1e3 / tokens, 1),
            "traffic_mb_per_token.backward": round(bwd * 1e3 / tokens, 1)}
