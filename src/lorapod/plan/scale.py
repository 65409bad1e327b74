"""Pricing a job on an instance with N GPUs (``compute.gpus``), trained data-parallel.

Data-parallel LoRA keeps the spec's global batch, so the job has the same number of optimizer
steps; each step's micro-batches are split over the N GPUs. Time per step is therefore the
one-GPU time divided by ``N x SCALING_EFFICIENCY``, and the instance costs N times one GPU's
price (RunPod bills per GPU; a Vast.ai offer's ``dph_total`` already covers all its GPUs).

``SCALING_EFFICIENCY`` is an assumption, stated wherever a plan uses it: LoRA gradients are
megabytes, so the all-reduce is small next to a step (bench/ddp_scaling.py measures its share);
what is lost is the slowest process setting the pace, windows that do not divide evenly, and the
input pipeline. It is not a published figure.
"""

from __future__ import annotations

from dataclasses import replace

from lorapod.catalog.prices import PriceEntry
from lorapod.plan.estimate import Speed
from lorapod.plan.vram import Estimate
from lorapod.spec import JobSpec

SCALING_EFFICIENCY = 0.9


def multi_gpu(speed: Speed, price: PriceEntry, gpus: int) -> tuple[Speed, PriceEntry, list[str]]:
    """``speed`` and ``price`` of one GPU -> those of an N-GPU instance, with the warning that says so."""
    if gpus <= 1:
        return speed, price, []
    k = gpus * SCALING_EFFICIENCY
    faster = replace(speed, seconds_per_step=speed.seconds_per_step / k, low=speed.low / k, high=speed.high / k)
    whole = replace(price, usd_per_hour=price.usd_per_hour * gpus)
    note = (f"{gpus} x {price.gpu} at ${price.usd_per_hour:.3f}/h each; data-parallel at an assumed "
            f"{SCALING_EFFICIENCY:.0%} scaling efficiency (docs/scale.md)")
    return faster, whole, [note]


# -- FSDP2 (LLM recipe): the frozen base sharded over the N GPUs

def sharded(est: Estimate, gpus: int) -> Estimate:
    """Per-GPU peak with the base weights split in ``gpus`` shards (FSDP2).

    A small, stated model: each GPU holds 1/N of the base, plus everything else whole (LoRA,
    optimizer, the activations of its own micro-batch, logits). The one or two blocks FSDP gathers
    at a time are left inside the estimate's framework-overhead term.
    """
    base = next((k for k in est.parts if k.startswith("base weights")), None)
    if base is None or gpus <= 1:
        return est
    parts = dict(est.parts)
    saved = parts[base] * (1 - 1 / gpus)
    parts[base] = round(parts[base] / gpus, 3)
    return replace(est, peak_gb=round(est.peak_gb - saved, 2), parts=parts)


def fsdp_host_ram_gb(whole: Estimate, gpus: int) -> float:
    """Host RAM per GPU for an FSDP2 job on ``gpus`` GPUs (what providers filter by, per GPU).

    Only rank 0 reads the base, into CPU RAM, and broadcasts it into the others' shards
    (engine/fsdp.py ``load_from_main``), so the instance holds one base in RAM, not one per
    process: the base weights once, plus for each process a quarter of its own GPU peak (data,
    the trainer's process), as :func:`lorapod.compute.offers.host_ram_needed_gb` counts one
    GPU's. A 70B base in bf16 on 8 GPUs: ~130 GB once, where every rank loading its own copy
    (review G14) needed 8 x 130 GB.
    """
    base = next((v for k, v in whole.parts.items() if k.startswith("base weights")), whole.peak_gb)
    per_gpu = sharded(whole, gpus).peak_gb
    return round((base + gpus * 0.25 * per_gpu) / max(1, gpus), 1)


def choose_parallel(requested: str, whole: Estimate, gpus: int, vram_gb: float | None,
                    *, shardable: bool = True) -> tuple[str, str]:
    """``ddp`` or ``fsdp`` for ``train.parallel`` = ``requested``, and the sentence that says why.

    ``auto`` picks FSDP2 only when the planner's estimate does not fit one GPU of ``vram_gb`` but
    its N-shard estimate does; ``shardable`` is False where FSDP2 is not offered (QLoRA, images).
    """
    if requested == "ddp" or gpus <= 1 or not shardable:
        return "ddp", "DDP: every process holds the whole base"
    split = sharded(whole, gpus)
    if requested == "fsdp":
        return "fsdp", f"FSDP2 (train.parallel fsdp): base sharded over {gpus} processes, ~{split.peak_gb:.1f} GB per GPU"
    if vram_gb is None:
        return "ddp", "DDP (train.parallel auto): no GPU memory to compare the estimate with"
    if whole.peak_gb <= vram_gb:
        return "ddp", f"DDP (train.parallel auto): the planner's {whole.peak_gb:.1f} GB fits one {vram_gb:g} GB GPU"
    if split.peak_gb <= vram_gb:
        return "fsdp", (f"FSDP2 (train.parallel auto): the planner's {whole.peak_gb:.1f} GB does not fit one "
                        f"{vram_gb:g} GB GPU; sharded over {gpus}: ~{split.peak_gb:.1f} GB per GPU")
    return "ddp", (f"DDP (train.parallel auto): {whole.peak_gb:.1f} GB does not fit one {vram_gb:g} GB GPU, "
                   f"nor {split.peak_gb:.1f} GB per GPU in {gpus} shards")


def shardable(spec: JobSpec, model: object) -> bool:
    """FSDP2 is offered for the LLM recipe with a full-precision base (not QLoRA's 4-bit one)."""
    from lorapod.catalog.models import LLMArch

    return isinstance(model, LLMArch) and spec.method.type != "qlora"
