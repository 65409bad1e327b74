"""A folder of clips and images as training windows: frames, captions, repeats, buckets.

Each clip is resampled to ``data.fps`` and cut into windows (``data.frame_extraction``: head,
uniform, slide) of the ``data.target_frames`` lengths, all of the form 4n+1 (the Wan VAE keeps the
first frame and packs every 4 after it into one latent frame). An image is a 1-frame video. A
window's bucket is (frames, width, height): the spatial bucket is the image engine's aspect-ratio
bucket of the clip's size, so batches never mix frame counts or sizes.

Bad input never stops a run that still has windows: a clip PyAV cannot decode, a clip shorter
than every target, a variable-frame-rate clip are findings; a folder with no caption at all and
no trigger is refused before any model is loaded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from lorapod.data.clips import VIDEO_EXTS, ClipError, probe, read_frames, resample, windows
from lorapod.data.findings import Finding, finding
from lorapod.engine.diffusion.dataset import (
    _REPEAT_DIR,
    IMAGE_EXTS,
    Fit,
    bucket_table,
    fit_image,
    item_caption,
)
from lorapod.errors import DataError


@dataclass(frozen=True)
class VideoItem:
    """One training window: a clip's source frames (or one image), fitted to a bucket."""

    path: Path
    caption: str
    digest: str  # sha256 of the file's bytes; with the frames and bucket, the latent cache key
    fit: Fit
    frames: tuple[int, ...]  # source frame indices; (0,) for an image
    repeats: int
    is_image: bool = False

    @property
    def bucket(self) -> tuple[int, int, int]:
        return (len(self.frames), *self.fit.bucket)

    @property
    def window_key(self) -> str:
        """The frames as a short stable string (part of the latent cache key)."""
        return hashlib.sha256(",".join(map(str, self.frames)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FrameRule:
    targets: tuple[int, ...]
    mode: str
    sample: int
    stride: int
    fps: float | None


def scan(folders: list[Path], resolution: int, caption_ext: str, default_repeats: int, rule: FrameRule,
         trigger: str | None = None) -> tuple[list[VideoItem], list[Finding]]:
    """Every usable window of every clip and image under ``folders``, with findings for the rest."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    findings: list[Finding] = []
    items: list[VideoItem] = []
    table = bucket_table(resolution)
    ext = caption_ext if caption_ext.startswith(".") else "." + caption_ext
    n_files = n_captioned = 0
    for folder in folders:
        if not folder.is_dir():
            raise DataError(f"video folder {folder} does not exist", hint="set data.path to a folder of clips/images + captions")
        m = _REPEAT_DIR.match(folder.name)
        repeats = int(m.group(1)) if m else default_repeats
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (*IMAGE_EXTS, *VIDEO_EXTS))
        for p in files:
            n_files += 1
            n_captioned += p.with_suffix(ext).is_file()
            is_image = p.suffix.lower() in IMAGE_EXTS
            if is_image:
                try:
                    with Image.open(p) as im:
                        size = ImageOps.exif_transpose(im).size
                except (OSError, UnidentifiedImageError, ValueError) as exc:
                    findings.append(finding("warning", "image-unreadable", p, f"cannot read this image ({exc}); skipped"))
                    continue
                spans = [(0,)]
            else:
                try:
                    info = probe(p)
                except ClipError as exc:
                    findings.append(finding("warning", exc.code, p, f"{exc.message}; skipped"))
                    continue
                if info.variable_fps and rule.fps:
                    findings.append(finding("warning", "video-variable-fps", p,
                                            "variable frame rate: resampling to data.fps assumes a constant one; "
                                            "re-encode at a fixed rate (ffmpeg -i in -r 16 out.mp4)"))
                src = resample(info.frames, info.fps, rule.fps)
                cuts = windows(len(src), list(rule.targets), rule.mode, rule.sample, rule.stride)
                if not cuts:
                    findings.append(finding("warning", "video-too-short", p,
                                            f"{len(src)} frames at {rule.fps or info.fps:g} fps, fewer than the shortest "
                                            f"data.target_frames ({min(rule.targets)}); skipped"))
                    continue
                spans = [tuple(src[s : s + t]) for t, s in cuts]
                size = (info.width, info.height)
            caption = item_caption(p, ext, trigger, findings)
            if caption is None:
                continue
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            fit = fit_image(size, table)
            items.extend(VideoItem(p, caption, digest, fit, span, repeats, is_image) for span in spans)
    if n_files and not n_captioned and not trigger:
        raise DataError(f"none of the {n_files} clips/images in {', '.join(map(str, folders))} has a {ext} caption, "
                        "and there is no data.trigger",
                        hint="write a caption per file (lorapod data check lists them) or set data.trigger")
    if not items:
        raise DataError(f"no usable clip or image in {', '.join(map(str, folders))}",
                        hint="put .mp4/.webm/.mov clips or images with same-name captions there; run `lorapod data check`")
    return items, findings


def _fit_frame(im, fit: Fit):
    from PIL import Image

    im = im.convert("RGB").resize(fit.resized, Image.Resampling.LANCZOS)
    left, top = fit.crop
    return im.crop((left, top, left + fit.bucket[0], top + fit.bucket[1]))


def load_window(item: VideoItem, flip: bool = False):
    """The window's frames resized to cover its bucket, centre-cropped, as a [-1, 1] (3, F, H, W) tensor."""
    import numpy as np
    import torch
    from PIL import Image, ImageOps

    if item.is_image:
        with Image.open(item.path) as im:
            frames = [ImageOps.exif_transpose(im).convert("RGB")]
    else:
        frames = read_frames(item.path, list(item.frames))
    arr = np.stack([np.asarray(_fit_frame(f, item.fit), dtype=np.float32) for f in frames]) / 127.5 - 1.0
    x = torch.from_numpy(arr).permute(3, 0, 1, 2).contiguous()
    return torch.flip(x, dims=[-1]) if flip else x


def describe(items: list[VideoItem]) -> dict:
    """Counts for the log: windows, files, samples per epoch, windows per (frames, w, h) bucket."""
    buckets: dict[str, int] = {}
    for it in items:
        f, w, h = it.bucket
        key = f"{f}x{w}x{h}"
        buckets[key] = buckets.get(key, 0) + 1
    return {"windows": len(items), "files": len({it.path for it in items}),
            "samples_per_epoch": sum(it.repeats for it in items), "buckets": buckets}
