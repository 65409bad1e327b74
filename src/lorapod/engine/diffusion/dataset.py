"""An image folder as training items: pictures, captions, repeats and buckets.

Layout is what ``lorapod data check`` validates and what sd-scripts users have: ``photo01.jpg`` +
``photo01.txt``. A folder named ``10_zxq`` repeats its images 10 times (the kohya convention);
otherwise ``data.repeats`` applies. Buckets are the data checker's (``lorapod.data.buckets``), so
``lorapod data check`` shows exactly the bucket plan training uses. Bad input never stops a run that still has images: an
unreadable picture is skipped with a finding, a caption in a legacy encoding is decoded and
reported.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

from lorapod.data.buckets import Bucket, make_buckets, place
from lorapod.data.findings import Finding, finding
from lorapod.errors import DataError

IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
_REPEAT_DIR = re.compile(r"^(\d+)_(.+)$")


@dataclass(frozen=True)
class Fit:
    """How an image of ``size`` becomes a ``bucket`` image: resize to ``resized``, crop at ``crop``."""

    size: tuple[int, int]  # original (w, h)
    bucket: tuple[int, int]  # target (w, h)
    resized: tuple[int, int]
    crop: tuple[int, int]  # (left, top) offset of the centre crop in the resized image


def bucket_table(resolution: int) -> list[Bucket]:
    """The data checker's buckets (sd-scripts' rule), with a 16 px step for the tiny test/demo sizes."""
    if resolution >= 256:
        return make_buckets(resolution)
    return make_buckets(resolution, min_size=16, steps=16)


def fit_image(size: tuple[int, int], table: list[Bucket]) -> Fit:
    p = place(size[0], size[1], table)
    return Fit(size, (p.bucket.width, p.bucket.height), p.resized, (p.crop[0] // 2, p.crop[1] // 2))


@dataclass(frozen=True)
class ImageItem:
    path: Path
    caption: str
    digest: str  # sha256 of the file's bytes: the cache key, so renames and touches reuse the cache
    fit: Fit
    repeats: int

    @property
    def bucket(self) -> tuple[int, int]:
        return self.fit.bucket


def read_caption(path: Path) -> tuple[str | None, list[Finding]]:
    """The caption's first line, as sd-scripts and ``lorapod data check`` read it. UTF-8 (with or
    without BOM); a legacy Windows-1252 file is decoded with a warning instead of stopping the run
    (the data check calls it an error, because other trainers would stop)."""
    raw = path.read_bytes()
    found: list[Finding] = []
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            text = raw.decode("cp1252")
        except UnicodeDecodeError:
            return None, [finding("error", "caption-encoding", path,
                                  "caption is neither UTF-8 nor Windows-1252; re-save it as UTF-8 (image skipped)")]
        found.append(finding("warning", "caption-encoding", path,
                             "caption is not UTF-8; read it as Windows-1252 - re-save it as UTF-8 to be sure"))
    lines = text.splitlines()
    if len([ln for ln in lines if ln.strip()]) > 1:
        found.append(finding("warning", "caption-multiline", path,
                             "several lines; only the first is trained (as in sd-scripts): join them with commas"))
    return (lines[0].strip() if lines else ""), found


def item_caption(p: Path, ext: str, trigger: str | None, findings: list[Finding]) -> str | None:
    """The caption a training item (image or clip) trains with: its caption file, trigger first;
    a missing file is a warning and trains with the trigger alone; ``None`` (with the finding) when
    the caption file is unusable and the item is skipped."""
    cap_path = p.with_suffix(ext)
    if cap_path.is_file():
        caption, found = read_caption(cap_path)
        findings.extend(found)
        if caption is None:
            return None
    else:
        caption = ""
        findings.append(finding("warning", "caption-missing", p, f"no {ext} caption; training it with "
                                f"{'the trigger only' if trigger else 'an empty caption'}"))
    if trigger and not caption.startswith(trigger):
        caption = f"{trigger}, {caption}" if caption else trigger
    return caption


def scan(folders: list[Path], resolution: int, use_buckets: bool, caption_ext: str, default_repeats: int,
         trigger: str | None = None) -> tuple[list[ImageItem], list[Finding]]:
    from PIL import Image, ImageOps, UnidentifiedImageError

    findings: list[Finding] = []
    items: list[ImageItem] = []
    table = bucket_table(resolution)
    if not use_buckets:  # one square bucket: every image is a centre crop of it
        side = max(b.width for b in table if b.width == b.height)
        table = [Bucket(side, side)]
    ext = caption_ext if caption_ext.startswith(".") else "." + caption_ext
    for folder in folders:
        if not folder.is_dir():
            raise DataError(f"image folder {folder} does not exist", hint="set data.path to a folder of images + captions")
        m = _REPEAT_DIR.match(folder.name)
        repeats = int(m.group(1)) if m else default_repeats
        files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTS and p.is_file())
        for p in files:
            try:
                with Image.open(p) as im:
                    im = ImageOps.exif_transpose(im)
                    im.load()
                    size = im.size
            except (OSError, UnidentifiedImageError, ValueError) as exc:
                findings.append(finding("warning", "image-unreadable", p, f"cannot read this image ({exc}); skipped"))
                continue
            caption = item_caption(p, ext, trigger, findings)
            if caption is None:
                continue
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            items.append(ImageItem(p, caption, digest, fit_image(size, table), repeats))
    if not items:
        raise DataError(f"no usable image in {', '.join(map(str, folders))}",
                        hint="put .png/.jpg/.webp images with same-name caption files there; run `lorapod data check`")
    return items, findings


def load_pixels(item: ImageItem, flip: bool):
    """The image resized to cover its bucket, centre-cropped, optionally flipped, as [-1, 1] CHW."""
    import numpy as np
    import torch
    from PIL import Image, ImageOps

    with Image.open(item.path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        f = item.fit
        im = im.resize(f.resized, Image.Resampling.LANCZOS)
        left, top = f.crop
        im = im.crop((left, top, left + f.bucket[0], top + f.bucket[1]))
        if flip:
            im = ImageOps.mirror(im)
        arr = np.asarray(im, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


def transform_caption(caption: str, rng: random.Random, shuffle: bool, dropout: float, keep_first: int = 1) -> str:
    """sd-scripts style: shuffle comma-separated tags after the first ``keep_first``; drop to '' with p=dropout."""
    if dropout and rng.random() < dropout:
        return ""
    if not shuffle:
        return caption
    tags = [t.strip() for t in caption.split(",") if t.strip()]
    head, tail = tags[:keep_first], tags[keep_first:]
    rng.shuffle(tail)
    return ", ".join(head + tail)
