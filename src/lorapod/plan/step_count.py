"""Count what one training step of the real architecture does, without weights or a GPU.

The planner's U-Net figures (activation memory, forward FLOPs, kernels per forward) are not
guesses: they come from building the model from its published config on torch's ``meta`` device
(no memory, no download), attaching LoRA the way trainers do, and running it under counters.

- Memory: one forward and backward, adding up the bytes of every tensor alive at once. Weights,
  buffers and anything else made before the count starts are left out, so what remains is what
  the step itself allocates: saved activations, the backward's gradients of them, and the
  recomputed blocks under gradient checkpointing.
- FLOPs: torch's own ``FlopCounterMode`` over one forward (attention's batched matmuls apart).
- Kernels: the operators one forward dispatches that do work (views and metadata left out), an
  upper bound on the kernel launches a GPU sees without ``torch.compile``.

Attention is counted as the fused kernels every trainer uses on a GPU (flash / memory-efficient
SDPA) behave: q, k, v, the output and one float32 log-sum-exp per query are kept, never the
(query x key) matrix. On ``meta`` torch would otherwise take the math path and keep that matrix.

``bench/derive_architecture.py`` prints the figures that ``catalog/data/models.yaml`` carries; a
test re-derives them, so the catalog cannot drift from the architecture. Needs torch (and
diffusers / peft for the U-Nets): a development tool, never imported by ``lorapod plan``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GiB = 1024**3


class LiveBytes(TorchDispatchMode):
    """Track the bytes of every storage created inside the mode while it is alive; keep the peak.

    Storages are keyed by their C++ identity, so views (a transpose, a reshape) add nothing and a
    storage counts once however many tensors share it. ``exclude``: tensors made before (weights)
    whose storages must not be counted when an op returns a view of them.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._skip = {t.untyped_storage()._cdata for t in exclude}
        self._live: set[int] = set()
        self.now = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._live or key in self._skip:
            return
        size = storage.nbytes()
        self._live.add(key)
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        if key in self._live:
            self._live.discard(key)
            self.now -= size


class _FusedAttention(torch.autograd.Function):
    """What flash / memory-efficient attention keeps for the backward: q, k, v, out, log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_fused_calls = [0]  # one GPU kernel each; the stand-in above dispatches no operator that counts


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_kw):
    _fused_calls[0] += 1
    return _FusedAttention.apply(query, key, value)


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """Make ``F.scaled_dot_product_attention`` keep what a fused GPU kernel keeps (see the module)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@dataclass(frozen=True)
class ForwardCount:
    tflops: float  # every counted FLOP of one forward
    attention_tflops: float  # of which attention's batched matmuls (q k^T and p v)
    kernels: int  # operators that do work


class _Ops(TorchDispatchMode):
    """Count the dispatched operators that compute something (not views, not metadata)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__ not in _NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


# Operators that launch no kernel: allocation, views torch does not mark as views, detaching.
_NO_KERNEL = {"detach.default", "empty.memory_format", "empty_strided.default", "new_empty.default",
              "empty_like.default", "lift_fresh.default", "_unsafe_view.default"}


def count_forward(forward: Callable[[], Any]) -> ForwardCount:
    """FLOPs and kernels of ``forward()`` (run twice: once per counter, with no autograd). FLOPs
    count attention's matmuls; kernels count attention as the one fused kernel a GPU runs."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = FlopCounterMode(display=False)
    with torch.no_grad(), flops:
        forward()
    ops = _Ops()
    before = _fused_calls[0]
    with torch.no_grad(), fused_attention(), ops:
        forward()
    attention_kernels = _fused_calls[0] - before
    by_op = flops.get_flop_counts()["Global"]
    attention = sum(v for k, v in by_op.items() if "bmm" in str(k) or "attention" in str(k))
    return ForwardCount(flops.get_total_flops() / 1e12, attention / 1e12, ops.count + attention_kernels)


@dataclass(frozen=True)
class StepMemory:
    saved_after_forward: int  # bytes alive when the forward ends (what the backward will read)
    peak: int  # bytes alive at the worst moment of forward + backward

    @property
    def peak_gib(self) -> float:
        return self.peak / GiB


def count_step(model: torch.nn.Module, forward: Callable[[], torch.Tensor]) -> StepMemory:
    """One forward (``forward()`` returns the loss) and backward of ``model`` under the counter."""
    counter = LiveBytes(exclude=[*model.parameters(), *model.buffers()])
    with fused_attention(), counter:
        loss = forward()
        saved = counter.now
        loss.backward()
    return StepMemory(saved, counter.peak)


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
# LoRA on the attention projections, as diffusers' and SimpleTuner's LoRA scripts attach it.
UNET_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _unet(family: str, resolution: int, batch: int, rank: int, checkpointing: bool):
    """The U-Net with LoRA on ``meta`` and a forward over cached latents / text embeddings."""
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    config = UNET_CONFIGS[family]
    default = torch.get_default_dtype()
    with torch.device("meta"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            unet = UNet2DConditionModel(**config)
            unet.requires_grad_(False)
            unet.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=UNET_LORA_TARGETS))
        finally:
            torch.set_default_dtype(default)
        if checkpointing:
            unet.enable_gradient_checkpointing()
        unet.train()
        side = resolution // 8
        latents = torch.empty(batch, 4, side, side, dtype=torch.bfloat16, device="meta")
        text = torch.empty(batch, 77, config["cross_attention_dim"], dtype=torch.bfloat16, device="meta")
        extra: dict[str, Any] = {}
        if family == "sdxl":  # pooled text embedding and the size / crop conditioning
            extra["added_cond_kwargs"] = {"text_embeds": torch.empty(batch, 1280, dtype=torch.bfloat16, device="meta"),
                                          "time_ids": torch.empty(batch, 6, dtype=torch.bfloat16, device="meta")}
    timesteps = torch.full((batch,), 500, device="meta")

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


def unet_lora_params_per_rank(family: str) -> float:
    """LoRA parameters per unit of rank with :data:`UNET_LORA_TARGETS`, in millions."""
    unet, _forward = _unet(family, 64, 1, 1, checkpointing=False)
    return sum(p.numel() for n, p in unet.named_parameters() if "lora_" in n) / 1e6


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

    default = torch.get_default_dtype()
    with torch.device("meta"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            vae = AutoencoderKL(**config)
        finally:
            torch.set_default_dtype(default)
        image = torch.empty(1, 3, resolution, resolution, dtype=torch.bfloat16)
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
    """Operators one forward of a transformers Llama decoder layer dispatches (SDPA attention),
    with LoRA (peft) on ``targets``: the planner's kernels per LLM layer and per LoRA linear."""
    return llama_layer(targets).kernels


def llama_layer(targets: tuple[str, ...] = (), hidden: int = 512, intermediate: int = 1024,
                tokens: int = 128) -> ForwardCount:
    """One forward of a transformers Llama decoder layer (bf16, SDPA) with LoRA on ``targets``."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=hidden // 128,
                         num_key_value_heads=hidden // 128, num_hidden_layers=1, attn_implementation="sdpa")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            layer = LlamaDecoderLayer(config, 0)
            if targets:
                layer = inject_adapter_in_model(LoraConfig(r=8, target_modules=list(targets)), layer)
            states = torch.empty(1, tokens, config.hidden_size)
            rope = LlamaRotaryEmbedding(config)(states, torch.arange(tokens)[None])
    finally:
        torch.set_default_dtype(default)
    return count_forward(lambda: layer(states, attention_mask=None, position_embeddings=rope))



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
# LoRA on the attention projections (present in every block of all three families).
DIT_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
TEXT_TOKENS = 512
FLUX_IMAGE_TOKENS = 4096  # 1024 px
WAN_LATENT = (21, 30, 52)  # 81 frames at 832x480


def _dit(key: str):
    """The DiT on ``meta`` with LoRA, its forward, and the tokens that pass through its linears."""
    family, config = DIT_CONFIGS[key]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the weights and inputs a bf16 step moves
    try:
        return _build_dit(family, config)
    finally:
        torch.set_default_dtype(default)


def _build_dit(family: str, config: dict[str, Any]):
    from peft import LoraConfig

    with torch.device("meta"):
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
        model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=DIT_LORA_TARGETS))
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
