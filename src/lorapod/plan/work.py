"""What one micro-batch step asks of the GPU: FLOPs, bytes and kernel launches, by physics.

A LoRA step on a frozen base runs the forward pass, a backward pass that needs only input
gradients (no weight gradients for the base, so about one forward's worth of matmul FLOPs), and,
with gradient checkpointing, the forward of every layer once more. Attention is counted apart,
because it grows with the square of the tokens it sees: text tokens of an LLM (causal, so half
of the square; twice that when the engine's attention path runs a full L x L, with an explicit
mask or eager, Settings.attention), latent tokens of an image or video (every frame's patches, plus the text tokens
when the model attends jointly). Its backward costs about 2.5 forwards (FlashAttention's
recomputation). Work that is not the denoiser's or the decoder's is counted too: a VAE encode and
a text-encoder forward per sample when they are not cached, the optimizer's read and write of
the adapters, and the weights streamed from memory every pass (dequantised every pass under
QLoRA or an fp8 base, once a forward under GPTQ). The bytes the memory-bound operators (norms,
rotary, activations, modulation, residuals, the LoRA branch) move, counted on the real layer
(LLMs) or the real U-Net / DiT (plan/counted_models.py); the FLOPs leave them out. Only the LLMs'
enter the step time (``Work.elementwise_gb``); the U-Nets' and DiTs' are counted but not timed
(``image_traffic_gb`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapod.catalog.models import ImageModel, LLMArch
from lorapod.plan.vram import BYTES_PER_PARAM, LORA_BYTES, OPTIMIZER_BYTES, Settings

ATTN_BWD = 2.5
# Bytes moved per base parameter per pass: a 16-bit weight is read once; a 4-bit or 8-bit one is
# read, dequantised to bf16 (written) and read again by the matmul. Dequantisation kernels do not
# reach the memory bandwidth, so their time gets a fitted factor (plan/speed.py).
STREAM_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4.0, "int8": 1.0 + 4.0, "nf4": 0.516 + 4.0,
                "gptq": 0.53 + 4.0}
QUANTISED = ("fp8", "int8", "nf4", "gptq")
# GPTQ as AutoGPTQ trains it (exllama disabled, inputs of 128 tokens or more): the 4-bit weights are
# unpacked by eager elementwise operators, not one fused kernel. Counted on the operators
# (plan/counted_llm.py: gptq_dequant, tests/test_plan_step_count.py): 16.63 bytes moved and 9
# kernels per weight before the fp16 matmul reads the result (2 bytes). The matmul saves that
# dequantised weight for its backward, so GPTQ dequantises once a forward (with checkpointing, the
# recompute once more), where bitsandbytes' nf4 dequantises again in the backward.
GPTQ_DEQUANT_BYTES = 16.63
GPTQ_DEQUANT_KERNELS = 9
# LLM operators per layer per forward, counted on transformers' Llama decoder layer in bf16 with
# SDPA (plan/counted_llm.py, tests/test_plan_step_count.py): 39 for the block (norms with their float32
# casts, rotary embedding and residuals run as separate kernels without torch.compile), 4 more
# for every LoRA-wrapped linear (two matmuls, the scale, the add).
LLM_KERNELS_PER_LAYER = 39
LORA_KERNELS = 4
# Bytes the same layer's operators other than its matmuls and fused attention move, per token
# (norms with their float32 casts, rotary embedding, SiLU and its product, residual adds; and
# the LoRA branch's scale and add), counted on transformers' Llama layer in bf16 with peft's LoRA
# (plan/counted_llm.py: llama_layer_traffic). Exact for any shape: coefficients of the hidden
# size, the intermediate size, the query and key/value widths (heads x head_dim), head_dim, and a
# constant; a LoRA-wrapped linear adds 10 x its output width forward, 6 x input + 4 x output in
# the backward.
LLM_TRAFFIC_FWD = (84, 10, 26, 22, 8, 48)
LLM_TRAFFIC_BWD = (198, 18, 34, 34, 8, 80)
LORA_TRAFFIC_FWD = (0, 10)  # (x input width, x output width)
LORA_TRAFFIC_BWD = (6, 4)


@dataclass(frozen=True)
class Work:
    """One micro-batch step. FLOPs in TFLOPs, bytes in GB."""

    matmul_tflops: float  # linear / conv work of the trained model (fwd + bwd + recompute)
    attention_tflops: float  # the quadratic part
    aux_tflops: float  # VAE encode / text encoders when not cached (forward only)
    stream_gb: float  # 16-bit base weights streamed from memory, all passes
    dequant_gb: float  # quantised base weights: read, dequantised, read again, all passes
    optimizer_gb: float  # adapters + optimizer state read and written once per optimizer step
    kernels: int  # kernel launches, all passes
    swap_gb: float  # weights moved host <-> GPU by block swap
    tokens: int  # tokens per step (LLMs) or latent tokens (images)
    elementwise_gb: float = 0.0  # memory-bound operators' traffic, all passes (counted on each architecture)

    @property
    def tflops(self) -> float:
        return self.matmul_tflops + self.attention_tflops + self.aux_tflops


def step_work(model: ImageModel | LLMArch, s: Settings) -> Work:
    if isinstance(model, LLMArch):
        return _llm_work(model, s)
    return _image_work(model, s)


def _passes(s: Settings) -> tuple[float, float]:
    """(matmul passes, attention passes) in forward-equivalents."""
    gc = 1.0 if s.gradient_checkpointing else 0.0
    return 2.0 + gc, 1.0 + ATTN_BWD + gc


def _llm_work(m: LLMArch, s: Settings) -> Work:
    tokens = s.batch * s.seq_len
    mm, att = _passes(s)
    lora = m.lora_params(s.r, s.targets)
    linear = 2 * (m.linear_params + 2 * lora) * tokens * mm
    attn = 2 * m.layers * m.heads * m.head_dim * s.seq_len * tokens * att  # causal: half of 4 s d
    if s.attention != "padding_free":  # a mask rules the causal kernels out: the whole L x L is computed
        attn *= 2
    head = 2 * m.vocab * m.hidden * tokens * s.label_fraction * 2.0  # forward + input gradient
    linear_bytes = m.linear_params * STREAM_BYTES[s.base_dtype] * mm
    dequant = linear_bytes if s.base_dtype in QUANTISED else 0.0
    stream = m.embedding_params * 2 * mm + (0.0 if dequant else linear_bytes)
    n_lora = len(m.lora_shapes(s.targets))
    kernels = int(m.layers * (LLM_KERNELS_PER_LAYER + LORA_KERNELS * n_lora) * (1 + 2 + (mm - 2)))
    if s.base_dtype == "gptq":  # dequantised each forward, read by the matmul every pass
        forwards = mm - 1
        dequant = m.linear_params * ((GPTQ_DEQUANT_BYTES + BYTES_PER_PARAM["bf16"]) * forwards
                                     + BYTES_PER_PARAM["bf16"])
        kernels += int(m.layers * len(m.linear_shapes()) * GPTQ_DEQUANT_KERNELS * forwards)
    opt = lora * (LORA_BYTES + OPTIMIZER_BYTES.get(s.optimizer, 8.0)) * 2 / max(1, s.grad_accum)
    ew = tokens * m.layers * layer_traffic(m, s, mm - 1)
    return Work((linear + head) / 1e12, attn / 1e12, 0.0, stream / 1e9, dequant / 1e9, opt / 1e9, kernels, 0.0, tokens,
                ew / 1e9)


def layer_traffic(m: LLMArch, s: Settings, forwards: float) -> float:
    """Bytes per token one LLM layer's memory-bound operators move in a step: ``forwards``
    forwards (2 with checkpointing) and one backward."""
    dims = (m.hidden, m.intermediate, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.head_dim, 1)
    fwd = sum(c * d for c, d in zip(LLM_TRAFFIC_FWD, dims, strict=True))
    bwd = sum(c * d for c, d in zip(LLM_TRAFFIC_BWD, dims, strict=True))
    for i, o in m.lora_shapes(s.targets):
        fwd += LORA_TRAFFIC_FWD[0] * i + LORA_TRAFFIC_FWD[1] * o
        bwd += LORA_TRAFFIC_BWD[0] * i + LORA_TRAFFIC_BWD[1] * o
    scale = 2.0 if s.base_dtype == "fp32" else 1.0
    return (fwd * forwards + bwd) * scale


def _image_work(m: ImageModel, s: Settings) -> Work:
    res, frames = int(s.resolution), int(s.frames)  # type: ignore[arg-type]
    mm, att = _passes(s)
    pixels = (res / m.ref_resolution) ** 2
    latent_frames = m.latent_frames(frames)
    if m.kind == "dit" and m.patch_px:
        img = m.image_tokens(res, frames)
        txt = s.text_tokens or m.text_tokens
        self_tokens = img + (txt if m.joint_text else 0)
        linear = 2 * (m.token_params_b or m.trained_params_b) * 1e9 * self_tokens
        attn = 4 * self_tokens**2 * m.hidden * m.attn_blocks
        if not m.joint_text:  # cross-attention to the text tokens
            attn += 4 * img * txt * m.hidden * m.attn_blocks
        linear, attn, tokens = linear / 1e12, attn / 1e12, int(self_tokens)
    else:
        ref = m.fwd_tflops_at_ref or 0.0
        attn = m.attn_tflops_at_ref * pixels**2 * latent_frames
        linear = (ref - m.attn_tflops_at_ref) * pixels * latent_frames
        tokens = int((res / 8) ** 2)
    aux = 0.0
    if not s.cache_latents:
        aux += m.vae_encode_tflops_at_ref * pixels * frames
    if not s.cache_text_encoder_outputs or s.train_text_encoder:
        # A trained text encoder also runs its backward (input gradients, about one forward more).
        te_passes = 2.0 if s.train_text_encoder else 1.0
        aux += 2 * m.text_encoder_params_b * 1e9 * max(m.text_tokens, 77) * te_passes / 1e12
    params = m.trained_params_b * 1e9
    weight_bytes = params * STREAM_BYTES[s.base_dtype] * mm
    dequant = weight_bytes if s.base_dtype in QUANTISED else 0.0
    stream = 0.0 if dequant else weight_bytes
    swap = 0.0
    if m.blocks and s.blocks_to_swap:
        swapped = min(s.blocks_to_swap, m.blocks - 1) / m.blocks
        swap = params * BYTES_PER_PARAM[s.base_dtype] * swapped * 2  # in for forward, again for backward
    lora = m.lora_params_per_rank_m * 1e6 * s.r
    opt = lora * (LORA_BYTES + OPTIMIZER_BYTES.get(s.optimizer, 8.0)) * 2 / max(1, s.grad_accum)
    kernels = int(m.kernels_per_fwd * (1 + 2 + (mm - 2)))
    b = s.batch
    # Counted (image_traffic_gb) but not timed: held out, timing it at the bandwidth x a fitted factor
    # put 71 of 125 published steps within 20% against 75 without (docs/planner.md, "Tried"): the
    # trainers these sources ran fuse or compile part of it, and at batch 1 much of it stays in L2.
    ew = 0.0
    return Work(linear * mm * b, attn * att * b, aux * b, stream / 1e9, dequant / 1e9, opt / 1e9, kernels, swap / 1e9,
                tokens * b, ew)


def image_traffic_gb(m: ImageModel, s: Settings, forwards: float) -> float:
    """GB one sample's memory-bound operators move in a step of a U-Net or DiT: ``forwards``
    forwards (2 with checkpointing) and one backward, counted on the architecture
    (models.yaml: traffic_gb_at_ref for U-Nets, scaled by the pixels and latent frames;
    traffic_mb_per_token for DiTs, times the tokens that run the blocks). Not in the step time:
    timed at the bandwidth x a fitted factor it made the held-out estimates worse (docs/planner.md),
    so for U-Nets and DiTs the host term still carries this time; kept so the figure is there
    to check against when measured steps of lorapod's own engine can tell them apart."""
    res, frames = int(s.resolution), int(s.frames)  # type: ignore[arg-type]
    scale = 2.0 if s.base_dtype == "fp32" else 1.0
    if m.kind == "dit" and m.patch_px:
        fwd, bwd = m.traffic_mb_per_token
        tokens = m.image_tokens(res, frames) + ((s.text_tokens or m.text_tokens) if m.joint_text else 0)
        return (fwd * forwards + bwd) * tokens / 1e3 * scale
    fwd, bwd = m.traffic_gb_at_ref
    return (fwd * forwards + bwd) * (res / m.ref_resolution) ** 2 * m.latent_frames(frames) * scale
