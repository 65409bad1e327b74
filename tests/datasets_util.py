"""Builders for small image datasets used by the data tests (real files, made in code)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter


def photo(size: tuple[int, int] = (1024, 1024), seed: int = 0, blur: float = 0.0) -> Image.Image:
    """A textured RGB image: low-res noise upscaled, so it has edges and a stable perceptual hash."""
    rng = np.random.default_rng(seed)
    small = (rng.random((24, 24, 3)) * 200 + 28).astype(np.uint8)
    im = Image.fromarray(small).resize(size, Image.Resampling.NEAREST)
    if blur:
        im = im.filter(ImageFilter.GaussianBlur(blur))
    return im


def save(im: Image.Image, path: Path, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, **kw)
    return path


def good_folder(root: Path, n: int = 16, trigger: str = "zxq_mug", size=(1024, 1024)) -> Path:
    """n distinct, sharp, captioned images: a dataset that should pass without errors."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        save(photo(size, seed=i), root / f"img{i:02d}.jpg", quality=92)
        (root / f"img{i:02d}.txt").write_text(f"{trigger}, a mug seen from angle {i}, on a table\n")
    return root


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under root (links not followed) with its content hash or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                st = p.stat()
                if st.st_size > 64 * 1024 * 1024:
                    out[rel] = f"big:{st.st_size}:{st.st_mtime_ns}"
                else:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() + f":{st.st_mtime_ns}"
    return out
