"""The architectures the planner knows, built from their published configs on torch's ``meta``
device, and the catalog figures counted on them (plan/step_count.py's counters).

SD 1.5 / SDXL: activation memory, forward and VAE-encode FLOPs, kernels per forward. The DiTs
(FLUX.1, FLUX.2 klein, Wan): the parameters each token's matmuls pass through, and kernels.
transformers' Llama layer: kernels per LLM layer and per LoRA linear. ``bench/derive_architecture.py``
prints them next to what ``catalog/data/models.yaml`` holds; tests/test_step_count.py requires the
two to be equal, so the catalog cannot drift from the architectures. Needs torch, diffusers, peft
and transformers: a development tool, never imported by ``lorapod plan``.
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
    count_traffic,
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


def _unet(family: str, resolution: int, batch: int, rank: int, checkpointing: bool):
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


def unet_figures(family: str, resolution: int) -> dict[str, float]:
    """The catalog's U-Net figures at ``resolution``, counted (models.yaml keys; see the module)."""
    fwd = unet_forward(family, resolution)
    return {
        "fwd_tflops_at_ref": round(fwd.tflops, 2),
        "attn_tflops_at_ref": round(fwd.attention_tflops, 3),
        "kernels_per_fwd": fwd.kernels,
        "vae_encode_tflops_at_ref": round(vae_encode(resolution).tflops, 2),
        "activations_gb_at_ref.checkpointing": round(unet_step(family, resolution, checkpointing=True).peak_gib, 2),
        "activations_gb_at_ref.no_checkpointing": round(unet_step(family, resolution, checkpointing=False).peak_gib, 2),
    }


# ----------------------------------------------------------------------------- LLM layers

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama_layer_kernels(targets: tuple[str, ...] = ()) -> int:
    """Operators one forward of a transformers Llama decoder layer dispatches (bf16, SDPA
    attention), with LoRA (peft) on ``targets``: the planner's kernels per LLM layer and per LoRA
    linear. The count does not depend on the layer's width or the tokens."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=1, attn_implementation="sdpa")
    with bf16_on_meta():
        layer = LlamaDecoderLayer(config, 0)
        if targets:
            layer = inject_adapter_in_model(LoraConfig(r=8, target_modules=list(targets)), layer)
        states = torch.empty(1, 128, config.hidden_size)
        rope = LlamaRotaryEmbedding(config)(states, torch.arange(128)[None])
    return count_forward(lambda: layer(states, attention_mask=None, position_embeddings=rope)).kernels



def llama_layer_traffic(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                        targets: tuple[str, ...] = (), tokens: int = 256) -> tuple[float, float]:
    """Bytes per token the memory-bound operators of a transformers Llama decoder layer move in
    one forward and in its backward (bf16, fused attention, the base frozen, LoRA from peft on
    ``targets``): everything but the matmuls (timed by their FLOPs) and attention (its own
    kernel). The planner's elementwise term (plan/work.py) holds these as coefficients."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=1,
                         attn_implementation="sdpa")
    with bf16_on_meta():
        layer = LlamaDecoderLayer(config, 0).requires_grad_(False)
        if targets:
            layer = inject_adapter_in_model(LoraConfig(r=8, target_modules=list(targets)), layer)
        states = torch.empty(1, tokens, hidden, requires_grad=True)  # a middle layer's input
        rope = LlamaRotaryEmbedding(config)(states, torch.arange(tokens)[None])
    moved = Traffic(skip=MATMULS)
    with fused_attention(), moved:
        out = layer(states, attention_mask=None, position_embeddings=rope)
        out = out[0] if isinstance(out, tuple) else out
        forward = moved.bytes
        out.backward(torch.empty_like(out))
    return forward / tokens, (moved.bytes - forward) / tokens


# ----------------------------------------------------------------------------- LLM losses

def loss_bytes_per_logit(framework: str, tokens: int = 512, vocab: int = 4096) -> float:
    """Peak bytes per (token x vocabulary) element of the LM head's output and the loss, forward
    and backward, as each trainer's code builds them (bf16 model): the planner's ``logit_bytes``
    (plan/frameworks.py) for the trainers whose loss runs eagerly.

    - ``hf``: transformers < 4.46 (LlamaForCausalLM): the model upcasts its logits to float32,
      shifts them with a contiguous copy, then cross-entropy.
    - ``transformers-4.46``: bf16 logits returned; the loss upcasts them and shifts the labels.
    - ``qwen-remote-code``: Qwen (v1)'s model code shifts the bf16 logits; the Trainer's bf16
      autocast runs the cross-entropy's log-softmax in float32 (an explicit upcast stands in).
    - ``lorapod``: lorapod's engine, logits at the label positions only, upcast, per-token loss.
    """
    import torch.nn.functional as F

    with bf16_on_meta():
        head = torch.nn.Linear(64, vocab, bias=False).requires_grad_(False)
        hidden = torch.empty(1, tokens, 64, requires_grad=True)
        labels = torch.zeros(1, tokens, dtype=torch.long)

    def hf() -> torch.Tensor:
        logits = head(hidden).float()
        return F.cross_entropy(logits[:, :-1].contiguous().view(-1, vocab), labels[:, 1:].reshape(-1))

    def transformers_446() -> torch.Tensor:
        logits = head(hidden)  # kept by the model's output until the loss returns
        return F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))

    def qwen_remote_code() -> torch.Tensor:
        shifted = head(hidden)[:, :-1].contiguous()
        return F.cross_entropy(shifted.view(-1, vocab).float(), labels[:, 1:].reshape(-1))

    def lorapod() -> torch.Tensor:
        logits = head(hidden[0])  # every position a label here
        return F.cross_entropy(logits.float(), labels[0], reduction="none").sum()

    forward = {"hf": hf, "transformers-4.46": transformers_446, "qwen-remote-code": qwen_remote_code,
               "lorapod": lorapod}[framework]
    return count_step(head, forward).peak / (tokens * vocab)


# ----------------------------------------------------------------------------- GPTQ bases

GPTQ_GROUP = 128


def gptq_dequant(bits: int = 4, in_features: int = 4096, out_features: int = 4096) -> Traffic:
    """One dequantisation of a GPTQ linear layer, the operators AutoGPTQ's ``QuantLinear``
    (qlinear_cuda_old, the one transformers' GPTQ integration loads for training, with exllama
    disabled) runs for inputs of 128 tokens or more, before its fp16 matmul reads the result:

        zeros  = ((qzeros[:, :, None] >> shifts) as int8) & mask, + 1         (per group: small)
        weight = ((qweight[:, None, :] >> shifts) as int8) & mask              (per weight)
        weight = scales * (weight - zeros)                                      (fp16, per weight)

    Counted on ``meta`` (plan/step_count.py's Traffic); divide by the weights for bytes per
    weight. 8-bit GPTQ unpacks to int16."""
    per_word = 32 // bits
    unpacked = torch.int16 if bits == 8 else torch.int8
    mask = 2**bits - 1
    groups = in_features // GPTQ_GROUP
    with torch.device("meta"):
        qweight = torch.empty(in_features // per_word, out_features, dtype=torch.int32)
        qzeros = torch.empty(groups, out_features // per_word, dtype=torch.int32)
        scales = torch.empty(groups, out_features, dtype=torch.float16)
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)[None]

    def dequantise() -> torch.Tensor:
        zeros = torch.bitwise_right_shift(qzeros[:, :, None].expand(-1, -1, per_word), shifts[None]).to(unpacked)
        torch.bitwise_and(zeros, mask, out=zeros)
        zeros = (zeros + 1).reshape(groups, 1, -1)
        weight = torch.bitwise_right_shift(qweight[:, None, :].expand(-1, per_word, -1), shifts[..., None]).to(unpacked)
        torch.bitwise_and(weight, mask, out=weight)
        return (scales[:, None, :] * (weight.reshape(groups, GPTQ_GROUP, -1) - zeros)).reshape(in_features, -1)

    return count_traffic(dequantise)


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


def _dit(key: str):
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


def dit_figures(key: str) -> dict[str, float]:
    """The catalog's DiT figures, counted: parameters each token's matmuls pass through (a
    double-stream block gives image and text tokens weights of their own, and adaLN modulation
    runs once a sample, not a token, so this is well below the parameter count for FLUX) and
    operators per forward."""
    _model, forward, tokens = _dit(key)
    count = count_forward(forward)
    linear = (count.tflops - count.attention_tflops) * 1e12
    return {"token_params_b": round(linear / (2 * tokens) / 1e9, 2), "kernels_per_fwd": count.kernels}
