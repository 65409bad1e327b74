"""Seconds per micro-batch step on a GPU: physics for the work, a fitted efficiency for the rest.

The GPU's own time (device):

    device = (matmul + attention + uncached VAE/text-encoder FLOPs) / (paper peak x efficiency)
           + base weights streamed every pass / memory bandwidth (x a fitted factor when dequantised)
           + adapters and optimizer state read and written / memory bandwidth
           + LLMs: the memory-bound operators' counted bytes / memory bandwidth (x a fitted factor;
             the U-Nets' and DiTs' are counted too, but not timed: plan/work.py)
           + kernels x the shortest time a kernel occupies the GPU (fitted, a few microseconds)

and the host's (Python, the dispatcher, autograd and the launch itself, per operator):

    host = kernels x host time per operator (fitted per kind)

The host queues kernels ahead of the GPU, so in principle its time shows only where the GPU
would idle: step = (device^P + host^P)^(1/P), the larger of the two when one dominates. Held
out, every P above 1 fits the published steps worse (docs/planner.md: 75 of 125 within 20% at
P = 1, 66 at 1.5, 62 at 2, 56 at 4): the trainers behind them behave as if the host's time per
operator were not hidden (their per-operator Python work, nn.Module and autograd bookkeeping sit
between kernels the GPU runs in microseconds), so P is 1 and the host's time adds. Then block
swap's host transfers: max(that, swapped bytes / PCIe) for a trainer that prefetches the next block
while one computes (kohya's offloader; lorapod's engine on CUDA), their sum for one that does not
(plan/frameworks.py: ``prefetches_blocks``).

The work terms are plan/work.py's physics. The efficiency is not assumed: it is
exp(kind + GPU architecture + GPU class + trainer), each term fitted to the published
measurements in catalog/data/measurements.yaml (plan/fit.py). Attention's quadratic part runs in
the fused kernel every trainer calls (FlashAttention / SDPA), so its efficiency is that kernel's:
a fitted base times a fitted factor per GPU architecture, whatever the trainer or model kind.
The dequantisation of a 4-bit or 8-bit base has its own fitted factor (how far below the memory
bandwidth those kernels run).

This module is the model only: given the parameters, it predicts. It imports nothing else of the
planner but the work it times (plan/work.py, plan/vram.py's Settings). The fit of the parameters
is plan/fit.py; the planner's estimate (the fitted parameters, the likely range, the user's own
runs, a card that spills) is plan/estimate.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lorapod.catalog.gpus import GPU
from lorapod.catalog.models import ImageModel, LLMArch
from lorapod.plan.frameworks import framework
from lorapod.plan.vram import Settings
from lorapod.plan.work import Work, step_work

# Effective host-to-GPU bandwidth for block swap (PCIe 4.0 x16 in practice).
PCIE_GB_S = 25.0
MAX_EFFICIENCY = 0.95
# Fused attention's share of the paper peak before any fit (log): a weak prior.
ATTENTION_PRIOR = math.log(0.3)
# The fitted term: how far below the memory bandwidth memory-bound operators run (log).
ELEMENTWISE = "elementwise"
# The shortest time a kernel occupies the GPU (log microseconds): launch, scheduling and the tail
# of a tiny grid; its prior (KERNEL_MIN_PRIOR_US in plan/fit.py) is measured, see docs/planner.md.
KERNEL_MIN = "kernel_min"
DEFAULT_KERNEL_MIN_US = 3.0
# Host time per operator of a kind the fit has not seen (microseconds).
DEFAULT_HOST_US = 15.0
# How sharply the host's and the GPU's times combine: (device^P + host^P)^(1/P); P = 1 adds them
# (no overlap), a large P takes the larger (perfect overlap). Chosen on the held-out check (above).
OVERLAP_P = 1.0


def combine(device: float, host: float) -> float:
    """The step time of a GPU that runs ``device`` seconds of work queued by a host that needs
    ``host`` seconds to issue it (see the module)."""
    if host <= 0:
        return device
    return float((device**OVERLAP_P + host**OVERLAP_P) ** (1 / OVERLAP_P))


@dataclass(frozen=True)
class Params:
    """The fitted part of the speed model, as log terms: efficiency terms by name, ``attention``
    and ``attention:<arch>`` (the fused attention kernel's efficiency), ``dequant:<dtype>`` (how
    much slower than the memory bandwidth dequantisation runs), ``compute:fp8``, ``elementwise``
    (the memory-bound operators' factor over the bandwidth), ``kernel_min`` (log microseconds a
    kernel occupies the GPU at least) and ``host:<kind>`` (log microseconds of host time per
    operator). A term the fit never saw counts as 0 (the kind's baseline) or its default."""

    theta: dict[str, float]

    def host_us(self, kind: str) -> float:
        return math.exp(self.theta.get(f"host:{kind}", math.log(DEFAULT_HOST_US)))

    def kernel_min_us(self) -> float:
        return math.exp(self.theta.get(KERNEL_MIN, math.log(DEFAULT_KERNEL_MIN_US)))


def kind_of(model: ImageModel | LLMArch) -> str:
    return "llm" if isinstance(model, LLMArch) else model.kind


def family_of(model: ImageModel | LLMArch) -> str:
    """The error-bar family: llm, image or video."""
    if isinstance(model, LLMArch):
        return "llm"
    return "video" if model.is_video else "image"


def features(model: ImageModel | LLMArch, s: Settings, gpu: GPU) -> list[str]:
    """The names of the efficiency terms that apply; the first is the kind's baseline."""
    feats = [f"kind:{kind_of(model)}", f"arch:{gpu.arch}", f"class:{gpu.gpu_class}", f"framework:{s.framework}"]
    return [*feats, "compute:fp8"] if fp8_peak_factor(s, gpu) > 1 else feats


# Architectures with fp8 tensor cores, whose dense fp8 peak is twice the bf16 one.
FP8_ARCHS = ("ada", "hopper", "blackwell")


def fp8_peak_factor(s: Settings, gpu: GPU) -> float:
    """How much higher than the bf16 peak the matmuls' paper peak is: 2 for fp8 matmuls on fp8
    tensor cores (they run at their own fitted efficiency, ``compute:fp8``), else 1."""
    return 2.0 if s.fp8_matmuls and gpu.arch in FP8_ARCHS else 1.0


def efficiencies(feats: list[str], params: Params) -> tuple[float, float]:
    """(matmul, attention) efficiencies: the matmuls' by all the terms, attention's by its own
    base and the GPU architecture only (see the module)."""
    e = math.exp(sum(params.theta.get(f, 0.0) for f in feats))
    att = math.exp(params.theta.get("attention", ATTENTION_PRIOR) + params.theta.get(attention_arch(feats), 0.0))
    return min(MAX_EFFICIENCY, e), min(MAX_EFFICIENCY, att)


def attention_arch(feats: list[str]) -> str:
    """The attention kernel's architecture term, from the features' ``arch:`` one."""
    arch = next(f for f in feats if f.startswith("arch:"))
    return "attention:" + arch.removeprefix("arch:")


# A quantiser whose kernels differ from its width's first one: its dequantisation cost is that
# one's times a factor of its own. GPTQ and nf4 both unpack 4-bit weights to bf16 every pass;
# integer 8-bit bases (quanto / SDNQ int8, 8-bit GPTQ) and fp8 ones both hold one byte a weight.
DEQUANT_PARENT = {"gptq": "nf4", "int8": "fp8"}


def dequant_terms(dtype: str) -> list[str]:
    """The fitted terms of a quantised base's dequantisation: its parent's and its own, so an
    estimate for a quantiser no point was fitted on falls back to its parent's measured cost,
    not to the memory bandwidth."""
    parent = DEQUANT_PARENT.get(dtype)
    return [f"dequant:{parent}", f"dequant:{dtype}"] if parent else [f"dequant:{dtype}"]


def dequant_factor(s: Settings, params: Params) -> float:
    """How much slower than the memory bandwidth the dequantisation of the base runs (fitted)."""
    return math.exp(sum(params.theta.get(n, 0.0) for n in dequant_terms(s.base_dtype)))


def terms(work: Work, gpu: GPU, effs: tuple[float, float], host_us: float, dequant: float = 1.0,
          mm_peak: float = 1.0, elementwise: float = 1.0, kernel_min_us: float = DEFAULT_KERNEL_MIN_US,
          ) -> dict[str, float]:
    """Seconds per step, term by term (before block swap's overlap): the GPU's own terms, then the
    host's time where the GPU would wait for it (the combined step minus the GPU's time);
    ``mm_peak``: the matmuls' paper peak over the bf16 one (fp8_peak_factor)."""
    e_mm, e_att = effs
    device = {
        "matmul compute": work.matmul_tflops / (gpu.bf16_tflops * mm_peak * e_mm),
        "attention compute": work.attention_tflops / (gpu.bf16_tflops * e_att),
        "uncached encoders": work.aux_tflops / (gpu.bf16_tflops * e_mm),
        "weights from memory": work.stream_gb / gpu.mem_bw_gbs,
        "dequantisation": work.dequant_gb / gpu.mem_bw_gbs * dequant,
        "optimizer": work.optimizer_gb / gpu.mem_bw_gbs,
        "memory-bound operators": work.elementwise_gb / gpu.mem_bw_gbs * elementwise,
        "per-kernel minimum": work.kernels * kernel_min_us * 1e-6,
    }
    busy = sum(device.values())
    host = work.kernels * host_us * 1e-6
    return {**device, "host, where the GPU waits": combine(busy, host) - busy}


def predict(model: ImageModel | LLMArch, s: Settings, gpu: GPU, params: Params) -> tuple[float, dict[str, float], float]:
    """(seconds per step, terms, matmul efficiency); a mix of buckets is the mean over its buckets."""
    variants = s.variants()
    total, eff = 0.0, 0.0
    parts: dict[str, float] = {}
    host = params.host_us(kind_of(model))
    for v in variants:
        work = step_work(model, v)
        effs = efficiencies(features(model, v, gpu), params)
        eff = effs[0]
        t = terms(work, gpu, effs, host, dequant_factor(v, params), fp8_peak_factor(v, gpu),
                  math.exp(params.theta.get(ELEMENTWISE, 0.0)), params.kernel_min_us())
        core = sum(t.values())
        swap = work.swap_gb / PCIE_GB_S
        if swap and framework(v.framework).prefetches_blocks:
            t["block swap (beyond overlap)"] = max(0.0, swap - core)
            total += max(core, swap)
        else:  # copied on the compute stream, right before each block: copy, then compute
            if swap:
                t["block swap (copies, not overlapped)"] = swap
            total += core + swap
        for k, x in t.items():
            parts[k] = parts.get(k, 0.0) + x / len(variants)
    return total / len(variants), parts, eff
