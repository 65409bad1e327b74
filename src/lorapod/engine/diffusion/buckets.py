"""Aspect-ratio buckets: train on each image at about the target area without a square crop.

Self-contained on purpose until the data checker's ``lorapod.data.buckets`` (branch ``data``) is
merged; both follow sd-scripts (``make_bucket_resolutions`` / ``select_bucket``): sides multiples
of ``step`` from 256 px to twice the resolution, area at most ``resolution**2``, each image to the
bucket with the closest aspect ratio, resized to cover it and centre-cropped. This module adds a
16 px step for the tiny resolutions of tests and the demo.
"""

from __future__ import annotations

from dataclasses import dataclass


def bucket_step(resolution: int) -> int:
    """64 px like sd-scripts for real resolutions; 16 px (VAE x8, Flux 2x2 packing) for tiny ones."""
    return 64 if resolution >= 256 else 16


def make_buckets(resolution: int, step: int | None = None) -> list[tuple[int, int]]:
    """sd-scripts' rule: all (width, height) with sides multiples of ``step`` between ``min_size``
    (256, or one step for tiny test resolutions) and twice the resolution, area <= resolution**2."""
    step = step or bucket_step(resolution)
    min_size = 256 if resolution >= 256 else step
    max_size = 2 * resolution
    area = resolution * resolution
    side = resolution // step * step
    out: set[tuple[int, int]] = {(side, side)}
    w = min_size
    while w <= max_size:
        h = min(max_size, int(area // w) // step * step)
        if h >= min_size:
            out.add((w, h))
            out.add((h, w))
        w += step
    return sorted(out)


def assign(width: int, height: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    """The bucket with the closest aspect ratio (sd-scripts: absolute difference); ties go to the larger area."""
    ar = width / height
    return min(buckets, key=lambda b: (abs(b[0] / b[1] - ar), -b[0] * b[1]))


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
