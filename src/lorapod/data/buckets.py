"""Aspect-ratio buckets: which training resolution each image lands in, and how it is scaled.

Same rule as kohya sd-scripts (``make_bucket_resolutions`` / ``BucketManager.select_bucket``):
buckets hold about ``resolution**2`` pixels, both sides a multiple of ``steps`` (64) between
``min_size`` and ``max_size``; an image goes to the bucket whose aspect ratio is closest to its
own and is scaled so it covers the bucket, then centre-cropped. The data checks use it to show
the bucket plan and to flag images that would be upscaled; the image engine uses it to batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The training resolution per family is the family table's (catalog/families.py: FamilyFacts.resolution).
# Whether an image is large enough is the bucket's question (``place(...).upscaled``), not its short
# side's: DOMAIN's "short side >= 1024" holds for square buckets, and a 832x1216 SDXL portrait fills its own.


@dataclass(frozen=True)
class Bucket:
    width: int
    height: int

    @property
    def aspect(self) -> float:
        return self.width / self.height

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class Placement:
    """Where one image goes: its bucket, the scale applied before the crop, the pixels cropped."""

    bucket: Bucket
    scale: float
    resized: tuple[int, int]
    crop: tuple[int, int]

    @property
    def upscaled(self) -> bool:
        return self.scale > 1.0 + 1e-9


def make_buckets(resolution: int, min_size: int = 256, max_size: int | None = None, steps: int = 64) -> list[Bucket]:
    """All buckets for a square training ``resolution`` (area ``resolution**2``), sorted.

    ``max_size`` defaults to twice the resolution (sd-scripts users set 2048 for SDXL).
    """
    if resolution < steps:
        raise ValueError(f"resolution {resolution} is below the bucket step {steps}")
    max_size = max_size or 2 * resolution
    max_area = resolution * resolution
    side = int(math.sqrt(max_area) // steps) * steps
    found = {(side, side)}
    width = min_size
    while width <= max_size:
        height = min(max_size, int((max_area // width) // steps) * steps)
        if height >= min_size:
            found.add((width, height))
            found.add((height, width))
        width += steps
    return [Bucket(w, h) for w, h in sorted(found)]


def place(width: int, height: int, buckets: list[Bucket]) -> Placement:
    """The bucket with the closest aspect ratio, and the scale that makes the image cover it."""
    if width <= 0 or height <= 0:
        raise ValueError("image sides must be positive")
    aspect = width / height
    bucket = min(buckets, key=lambda b: (abs(b.aspect - aspect), -b.width * b.height))
    scale = bucket.height / height if aspect > bucket.aspect else bucket.width / width
    resized = (int(width * scale + 0.5), int(height * scale + 0.5))
    crop = (max(0, resized[0] - bucket.width), max(0, resized[1] - bucket.height))
    return Placement(bucket=bucket, scale=scale, resized=resized, crop=crop)
