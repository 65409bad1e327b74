"""Training speed per GPU: seconds per step (images) or tokens per second (LLMs).

time per step = FLOPs per step / (GPU paper peak x class efficiency x family MFU)
              + bytes of frozen weights read per step / memory bandwidth
              + block-swap traffic / PCIe bandwidth,
times 1.2 with gradient checkpointing (the guides: "about 20% more time").

A family's MFU is not guessed: it is solved from the published point in the catalog (SDXL:
1.25 it/s on an RTX 4090; FLUX.2 klein: 1800 steps in under an hour on an RTX 4090). Families
without a point borrow the MFU of the family named in ``speed_like``; LLMs use LLM_MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.models import ImageModel, LLMArch, image_model
from lorapod.plan.vram import BYTES_PER_PARAM, Estimate, Settings

GC_TIME_FACTOR = 1.2
# Frozen base: the backward pass needs input gradients only (no weight gradients), so a step is
# about two forward passes of compute.
FWD_BWD_FACTOR = 2.0
# bitsandbytes 4-bit dequantisation makes QLoRA steps slower than LoRA ones.
QLORA_TIME_FACTOR = 1.3
# Sustained model-FLOPs utilisation of LoRA training on LLMs (transformers + PEFT, SDPA, bf16),
# relative to the GPU's effective peak. An assumption: no published point in our sources.
LLM_MFU = 0.35
# Effective host-to-GPU bandwidth for block swap (PCIe 4.0 x16 in practice).
PCIE_GB_S = 25.0
# A card that runs out of VRAM and spills into shared system memory (Windows drivers) drops to
# 50+ s per step (kohya_ss issue #1288, quoted by the guide). On Linux hosts it is an OOM.
SPILL_SECONDS_PER_STEP = 50.0


@dataclass(frozen=True)
class Speed:
    seconds_per_step: float
    tokens_per_step: int = 0
    spill: bool = False
    mfu: float = 0.0

    @property
    def it_per_s(self) -> float:
        return 1.0 / self.seconds_per_step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.seconds_per_step if self.tokens_per_step else 0.0


def _image_compute_tflops(m: ImageModel, s: Settings) -> float:
    return m.fwd_tflops(s.resolution) * s.batch * FWD_BWD_FACTOR


def _weight_bytes(m: ImageModel | LLMArch, s: Settings) -> float:
    params = m.trained_params_b * 1e9 if isinstance(m, ImageModel) else m.params
    return params * BYTES_PER_PARAM[s.base_dtype]


def _memory_seconds(m: ImageModel | LLMArch, s: Settings, gpu: GPU) -> float:
    passes = 3 if s.gradient_checkpointing else 2
    return _weight_bytes(m, s) * passes / (gpu.mem_bw_gbs * 1e9)


def _swap_seconds(m: ImageModel, s: Settings) -> float:
    if not (m.blocks and s.blocks_to_swap):
        return 0.0
    swapped = _weight_bytes(m, s) * min(s.blocks_to_swap, m.blocks - 1) / m.blocks
    return swapped * 2 / (PCIE_GB_S * 1e9)


def family_mfu(m: ImageModel) -> float:
    """Solve the MFU from the family's published point (or the point of its ``speed_like``)."""
    ref = m if m.calibration else image_model(m.speed_like or "sdxl")
    cal = ref.calibration
    assert cal, f"{ref.name} has no calibration point"
    gpu = find_gpu(cal["gpu"])
    s = Settings("bf16", 16, "all-linear", "adamw_8bit", bool(cal["gradient_checkpointing"]),
                 int(cal["batch"]), resolution=int(cal["resolution"]))
    step = 1.0 / float(cal["it_per_s"])
    if s.gradient_checkpointing:
        step /= GC_TIME_FACTOR
    compute_s = step - _memory_seconds(ref, s, gpu)
    return _image_compute_tflops(ref, s) / (compute_s * gpu.effective_tflops)


def llm_step_tflops(m: LLMArch, s: Settings) -> float:
    """Forward + input-gradient backward FLOPs of one micro-batch, in TFLOPs."""
    tokens = s.batch * s.seq_len
    linear = 2 * FWD_BWD_FACTOR * m.linear_params * tokens
    head = 2 * FWD_BWD_FACTOR * m.vocab * m.hidden * tokens
    # causal attention: QK^T and AV, 2 x 2 x seq x dim per token per layer, halved by the mask;
    # backward about twice the forward.
    attn = 3 * 2 * m.layers * s.seq_len * m.heads * m.head_dim * tokens
    return (linear + head + attn) / 1e12


def step_speed(model: ImageModel | LLMArch, s: Settings, gpu: GPU, est: Estimate | None = None) -> Speed:
    spill = est is not None and est.verdict(gpu) == "does-not-fit"
    if isinstance(model, ImageModel):
        mfu = family_mfu(model)
        compute = _image_compute_tflops(model, s) / (gpu.effective_tflops * mfu)
        tokens = 0
    else:
        mfu = LLM_MFU
        compute = llm_step_tflops(model, s) / (gpu.effective_tflops * mfu)
        tokens = s.batch * s.seq_len
    seconds = compute + _memory_seconds(model, s, gpu)
    if isinstance(model, ImageModel):
        seconds += _swap_seconds(model, s)
    if s.gradient_checkpointing:
        seconds *= GC_TIME_FACTOR
    if s.base_dtype == "nf4":
        seconds *= QLORA_TIME_FACTOR
    if spill:
        seconds = max(seconds, SPILL_SECONDS_PER_STEP)
    return Speed(seconds, tokens, spill, mfu)
