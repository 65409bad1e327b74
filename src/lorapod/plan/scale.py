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
from lorapod.plan.speed import Speed

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
