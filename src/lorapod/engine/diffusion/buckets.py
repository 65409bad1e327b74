"""Aspect-ratio buckets: train on each image at about the target area without a square crop.

Self-contained on purpose (the data checker has its own bucket plan in ``lorapod.data``; the two
agree on the rule: sides are multiples of ``step``, area at most ``resolution**2``, and an image
goes to the bucket whose aspect ratio is closest in log space, then is resized to cover it and
centre-cropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def bucket_step(resolution: int) -> int:
    """64 px like sd-scripts for real resolutions; 16 px (VAE x8, Flux 2x2 packing) for tiny ones."""
    return 64 if resolution >= 256 else 16


def make_buckets(resolution: int, step: int | None = None, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """All (width, height) with sides multiples of ``step``, area <= resolution**2, ratio <= max_ratio."""
    step = step or bucket_step(resolution)
    area = resolution * resolution
    out: set[tuple[int, int]] = {(resolution // step * step, resolution // step * step)}
    w = step
    while w <= resolution * max_ratio:
        h = min(int(area // w) // step * step, int(w * max_ratio) // step * step)
        if h >= step and max(w / h, h / w) <= max_ratio:
            out.add((w, h))
        w += step
    return sorted(out)


def assign(width: int, height: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    """The bucket with the closest aspect ratio; ties go to the larger area."""
    ar = math.log(width / height)
    return min(buckets, key=lambda b: (abs(math.log(b[0] / b[1]) - ar), -b[0] * b[1]))


@dataclass(frozen=True)
class Fit:
    """How an image of ``size`` becomes a ``bucket`` image: resize to ``resized``, crop at ``crop``."""

    size: tuple[int, int]  # original (w, h)
    bucket: tuple[int, int]  # target (w, h)
    resized: tuple[int, int]
    crop: tuple[int, int]  # (left, top) in the resized image


def fit(size: tuple[int, int], bucket: tuple[int, int]) -> Fit:
    w, h = size
    bw, bh = bucket
    scale = max(bw / w, bh / h)
    rw, rh = max(bw, round(w * scale)), max(bh, round(h * scale))
    return Fit(size=size, bucket=bucket, resized=(rw, rh), crop=((rw - bw) // 2, (rh - bh) // 2))
