"""Aspect-ratio buckets: same rule as sd-scripts, placement and upscale detection."""

from __future__ import annotations

import pytest

from lorapod.data.buckets import Bucket, make_buckets, place


def test_buckets_multiple_of_64_and_about_the_area():
    buckets = make_buckets(1024)
    assert Bucket(1024, 1024) in buckets
    assert Bucket(1152, 896) in buckets and Bucket(896, 1152) in buckets
    for b in buckets:
        assert b.width % 64 == 0 and b.height % 64 == 0
        assert 256 <= b.width <= 2048 and 256 <= b.height <= 2048
        assert b.width * b.height <= 1024 * 1024
    assert buckets == sorted(buckets, key=lambda b: (b.width, b.height))


def test_sd15_buckets():
    buckets = make_buckets(512)
    assert Bucket(512, 512) in buckets and Bucket(768, 320) in buckets
    assert max(b.width * b.height for b in buckets) <= 512 * 512


def test_place_landscape_covers_bucket():
    p = place(1600, 1200, make_buckets(1024))
    assert p.bucket == Bucket(1152, 896)
    assert p.resized[0] >= 1152 and p.resized[1] >= 896
    assert not p.upscaled


def test_place_small_image_is_upscaled():
    p = place(800, 600, make_buckets(1024))
    assert p.upscaled and p.scale == pytest.approx(896 / 600, rel=1e-6)


def test_place_rejects_empty():
    with pytest.raises(ValueError):
        place(0, 10, make_buckets(512))
