"""Benchmark: `lorapod data check` on 1,000 images vs a naive sequential Pillow loop.

    python bench/data_check.py [--n 1000] [--dir /tmp/lorapod-bench-images]

The images (1024x768 JPEGs with captions) are generated once and reused. The baseline is the
loop people write by hand: open each file, decode it fully, convert to RGB and grayscale, and
compute the same facts lorapod reports (sha256, sharpness, brightness, a perceptual hash), one
image after the other. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lorapod.data.imageinfo import laplacian_variance, phash
from lorapod.data.images import check_images, default_workers


def generate(folder: Path, n: int) -> None:
    marker = folder / f".complete-{n}"
    if marker.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        small = (rng.random((48, 64, 3)) * 255).astype(np.uint8)
        im = Image.fromarray(small).resize((1024, 768), Image.Resampling.BICUBIC)
        im.save(folder / f"img{i:04d}.jpg", quality=90)
        (folder / f"img{i:04d}.txt").write_text(f"zxq_mug, a mug, photo {i}\n")
    marker.write_text("ok")


def naive(folder: Path) -> int:
    n = 0
    for p in sorted(folder.glob("*.jpg")):
        data = p.read_bytes()
        hashlib.sha256(data).hexdigest()
        with Image.open(p) as im:
            rgb = im.convert("RGB")
        gray = rgb.convert("L")
        a = np.asarray(gray, dtype=np.float32)
        laplacian_variance(a)
        float(a.mean())
        phash(gray)
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "lorapod-bench-images")
    args = ap.parse_args()
    t = time.perf_counter()
    generate(args.dir, args.n)
    gen = time.perf_counter() - t
    for p in args.dir.iterdir():  # warm the page cache so both runs read from memory
        if p.is_file():
            p.read_bytes()

    t, c = time.perf_counter(), time.process_time()
    count = naive(args.dir)
    t_naive, c_naive = time.perf_counter() - t, time.process_time() - c

    t, c = time.perf_counter(), time.process_time()
    report = check_images(args.dir, family="sdxl", trigger="zxq_mug")
    t_lorapod, c_lorapod = time.perf_counter() - t, time.process_time() - c
    assert report.summary["readable"] == count == args.n, report.summary

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.n} JPEGs 1024x768 (generated in {gen:.1f} s), {os.cpu_count()} CPU cores, "
          f"{default_workers()} decode threads, load average {load:.1f} at the end\n")
    print("| method | wall s | images/s | speed-up | CPU s (all threads) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| naive sequential Pillow loop (full decode) | {t_naive:.2f} | {args.n / t_naive:.0f} | 1.0x "
          f"| {c_naive:.2f} |")
    print(f"| `lorapod data check` (all checks) | {t_lorapod:.2f} | {args.n / t_lorapod:.0f} | "
          f"{t_naive / t_lorapod:.1f}x | {c_lorapod:.2f} |")


if __name__ == "__main__":
    main()
