"""``lorapod data check DIR``: every check of an image-LoRA dataset folder, in one pass.

The folder is walked once (``scan``), every image decoded once in a thread pool
(``imageinfo``), captions paired and read (``captionfiles``), then the dataset-wide checks
run on the collected facts: duplicates, outliers, count, bucket plan. Nothing is written.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lorapod.catalog import families
from lorapod.data.buckets import make_buckets, place
from lorapod.data.captionfiles import (
    CLIP_WINDOW,
    REPEATED_CAPTION_MIN,
    check_toml,
    clip_counter,
    dominant_extension,
    pair_captions,
    read_caption,
    trigger_findings,
)
from lorapod.data.findings import Finding, Report, finding
from lorapod.data.imageinfo import EXT_FORMAT, ImageInfo, inspect_image
from lorapod.data.scan import scan_folder
from lorapod.errors import DataError, require

NEAR_DUPLICATE_MAX_DISTANCE = 6  # of 64 pHash bits; unrelated photos differ in ~32
BLUR_ABSOLUTE = 20.0  # Laplacian variance at 192 px short side; sharp photos score in the hundreds
BLUR_RELATIVE = 0.2  # or below this fraction of the dataset's median sharpness
DARK_MEAN, BRIGHT_MEAN = 40.0, 220.0
COUNT_RANGE = (15, 40)
UPSCALE_WARN = 1.25  # above this an image is too small for its bucket (a warning), below a note


def default_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def inspect_all(paths: list[Path], rels: list[str], workers: int | None = None) -> list[ImageInfo]:
    """Decode and measure every image, in parallel threads (Pillow decodes without the GIL)."""
    workers = workers or default_workers()
    if workers == 1 or len(paths) < 4:
        return [inspect_image(p, r) for p, r in zip(paths, rels, strict=True)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lorapod-img") as pool:
        return list(pool.map(inspect_image, paths, rels, chunksize=8))


def image_findings(info: ImageInfo, family: str) -> list[Finding]:
    rel = info.rel
    if not info.ok:
        return [finding("error", info.error_code or "image-corrupt", rel, info.error or "cannot decode.")]
    out: list[Finding] = []
    ext_format = EXT_FORMAT.get(info.path.suffix.lower())
    if info.sniffed and ext_format and info.sniffed != ext_format:
        out.append(finding("warning", "image-extension-mismatch", rel,
                           f"named {info.path.suffix} but is a {info.sniffed} file; rename it to match (`lorapod data fix` does)."))
    if info.orientation not in (1, 0):
        out.append(finding("warning", "image-exif-rotated", rel,
                           f"EXIF orientation {info.orientation}: trainers such as sd-scripts ignore it and see the "
                           "image rotated or mirrored; `lorapod data fix` bakes the rotation in."))
    if info.mode == "CMYK":
        out.append(finding("warning", "image-cmyk", rel,
                           "CMYK colour: converted to RGB naively the colours shift; `lorapod data fix` converts it."))
    if info.alpha:
        if info.alpha_used:
            out.append(finding("warning", "image-alpha", rel,
                               "transparent pixels: trainers drop the alpha and what is under it shows up "
                               "(often black); `lorapod data fix` flattens it on white."))
        else:
            out.append(finding("info", "image-alpha-unused", rel, "has an alpha channel that is fully opaque."))
    if info.bits == 16:
        out.append(finding("warning", "image-16bit", rel,
                           "16 bits per channel: some loaders clip or refuse it; save an 8-bit copy."))
    if info.mode in ("L", "I;16", "I", "1"):
        out.append(finding("info", "image-grayscale", rel, "grayscale image; fine if intended (the LoRA learns it)."))
    # Size is judged where the trainer judges it: by the aspect bucket it lands in (check_images'
    # bucket loop), not by the short side alone: an SDXL portrait of 832x1216 fills its bucket.
    if info.brightness is not None:
        if info.brightness < DARK_MEAN or (info.dark_fraction or 0) > 0.6:
            out.append(finding("warning", "image-underexposed", rel,
                               f"very dark (mean {info.brightness:.0f}/255); brighten it or replace it."))
        elif info.brightness > BRIGHT_MEAN or (info.bright_fraction or 0) > 0.6:
            out.append(finding("warning", "image-overexposed", rel,
                               f"very bright (mean {info.brightness:.0f}/255, {100 * (info.bright_fraction or 0):.0f}% "
                               "clipped); fine for a white-background product shot, otherwise replace it."))
    return out


def _badly_exposed(info: ImageInfo) -> bool:
    """The exposure rule of ``image_findings`` (under- or overexposed)."""
    if info.brightness is None:
        return False
    return (info.brightness < DARK_MEAN or (info.dark_fraction or 0) > 0.6
            or info.brightness > BRIGHT_MEAN or (info.bright_fraction or 0) > 0.6)


def _blur_findings(infos: list[ImageInfo]) -> list[Finding]:
    scores = [i.sharpness for i in infos if i.ok and i.sharpness is not None]
    if not scores:
        return []
    median = statistics.median(scores)
    out = []
    for i in infos:
        if not i.ok or i.sharpness is None or _badly_exposed(i):
            continue  # a near-uniform dark or bright image has no edges: it is flagged for exposure only
        relative = len(scores) >= 5 and i.sharpness < BLUR_RELATIVE * median
        if i.sharpness < BLUR_ABSOLUTE or relative:
            out.append(finding("warning", "image-blurry", i.rel,
                               f"looks blurred (sharpness {i.sharpness:.0f}, dataset median {median:.0f}); "
                               "the LoRA learns blur too: replace it with a sharp shot."))
    return out


def find_duplicates(infos: list[ImageInfo]) -> tuple[list[list[str]], list[tuple[str, str, int]]]:
    """Exact duplicate groups (same bytes) and near-duplicate pairs (pHash distance <= threshold)."""
    ok = [i for i in infos if i.ok and i.sha256]
    groups: dict[str, list[str]] = {}
    for i in ok:
        groups.setdefault(i.sha256 or "", []).append(i.rel)
    exact = [g for g in groups.values() if len(g) > 1]
    hashed = [i for i in ok if i.phash is not None]
    near: list[tuple[str, str, int]] = []
    if len(hashed) > 1:
        h = np.array([i.phash for i in hashed], dtype=np.uint64)
        dist = np.bitwise_count(h[:, None] ^ h[None, :])
        rows, cols = np.nonzero(np.triu(dist <= NEAR_DUPLICATE_MAX_DISTANCE, k=1))
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            a, b = hashed[r], hashed[c]
            if a.sha256 != b.sha256:
                near.append((a.rel, b.rel, int(dist[r, c])))
    near.sort(key=lambda t: (t[2], t[0], t[1]))
    return exact, near


def check_images(
    root: Path,
    *,
    family: str = families.DEFAULT_IMAGE_FAMILY,
    trigger: str | None = None,
    tokenizer: Path | None = None,
    workers: int | None = None,
) -> Report:
    """All image-folder checks; ``report.extra`` keeps per-image facts for the HTML report."""
    require("PIL", "data", "Checking image datasets")
    if family not in families.FAMILIES:
        raise DataError(f"unknown image family {family!r}.", hint=f"Use one of: {', '.join(families.NAMES)}.")
    scan = scan_folder(root)
    report = Report()
    report.extend(scan.findings)
    if scan.videos:
        report.add(finding("info" if scan.images else "error", "video-files", ".",
                           f"{len(scan.videos)} video clips, which the {family} image check ignores; for a video "
                           "LoRA check with --family wan21 (or wan22)."))
    if not scan.images:
        report.add(finding("error", "no-images", ".",
                           "no .jpg/.jpeg/.png/.webp image in this folder (or its subfolders); "
                           "is this the right folder?"))
    toml_ext, toml_findings = check_toml(scan)
    report.extend(toml_findings)
    extension = toml_ext or dominant_extension(scan)
    if scan.captions and extension != ".txt":
        report.add(finding("info", "caption-extension-not-txt", ".",
                           f"captions are {extension} files: set data.caption_extension: \"{extension}\" in the "
                           "job spec (lorapod and ai-toolkit default to .txt)."))
    pairing, pair_findings = pair_captions(scan, extension)
    report.extend(pair_findings)

    infos = inspect_all(scan.images, [scan.rel(p) for p in scan.images], workers)
    for info in infos:
        report.extend(image_findings(info, family))
    report.extend(_blur_findings(infos))
    exact, near = find_duplicates(infos)
    for group in exact:
        report.add(finding("warning", "duplicate-exact", group[0],
                           f"identical files: {', '.join(group)}; keep one (duplicates over-weight that shot)."))
    for a, b, d in near:
        report.add(finding("warning", "duplicate-near", a,
                           f"near duplicate of {b} (perceptual distance {d}/64); keep the better one, or vary them."))

    # captions: read, trigger, length, repetition
    count_tokens, token_method = clip_counter(tokenizer)
    captions: dict[str, str] = {}
    for img, cap in pairing.captions.items():
        if cap is None:
            continue
        rel = scan.rel(cap)
        try:
            ct = read_caption(cap, rel)
        except OSError as exc:
            report.add(finding("error", "caption-unreadable", rel, f"cannot read: {exc.strerror}."))
            continue
        report.extend(ct.findings)
        if not ct.text:
            continue
        captions[scan.rel(img)] = ct.text
        if trigger:
            report.extend(trigger_findings(ct.text, trigger, rel))
        encoders = families.FAMILIES[family].text_encoders
        if encoders in ("clip", "clip+t5"):
            n = count_tokens(ct.text)
            if n > CLIP_WINDOW:
                sev = "warning" if encoders == "clip" else "info"
                tail = ("the rest is cut off" if sev == "warning"
                        else "FLUX.1's CLIP encoder cuts the rest (T5 still reads it)")
                report.add(finding(sev, "caption-too-long", rel,
                                   f"{n} CLIP tokens > {CLIP_WINDOW} ({token_method}): {tail}; shorten it."))
    for text, n in Counter(captions.values()).items():
        if n >= REPEATED_CAPTION_MIN:
            who = sorted(k for k, v in captions.items() if v == text)
            report.add(finding("warning", "caption-repeated", who[0],
                               f"the same caption on {n} images ({', '.join(who[:4])}{' ...' if n > 4 else ''}): "
                               "describe what differs in each (angle, light, background)."))

    # count guidance and the bucket plan
    readable = [i for i in infos if i.ok]
    lo, hi = COUNT_RANGE
    if readable and len(readable) < lo:
        report.add(finding("warning", "count-low", ".",
                           f"{len(readable)} usable images; {lo}-{hi} is the usual range for a person, object or style."))
    elif len(readable) > hi:
        report.add(finding("info", "count-high", ".",
                           f"{len(readable)} images; more than the usual {lo}-{hi}: fine for a style, "
                           "slower per epoch; check they all show the concept."))
    resolution = families.FAMILIES[family].resolution
    buckets = make_buckets(resolution)
    plan: dict[str, dict[str, int]] = {}
    placements = {}
    for i in readable:
        w, h = i.width, i.height  # as stored: sd-scripts does not apply EXIF orientation
        p = place(w, h, buckets)
        placements[i.rel] = p
        row = plan.setdefault(str(p.bucket), {"images": 0, "upscaled": 0})
        row["images"] += 1
        if p.upscaled:  # one finding per image: too small for its bucket (a lot) or a little upscaled
            row["upscaled"] += 1
            big = p.scale > UPSCALE_WARN
            report.add(finding("warning" if big else "info", "image-too-small" if big else "bucket-upscale", i.rel,
                               f"{w}x{h} lands in bucket {p.bucket} (about {resolution}x{resolution} pixels, as the "
                               f"trainer buckets it) and would be upscaled x{p.scale:.2f}; use a larger original "
                               "(upscaled pixels teach blur)."))
    report.summary.update({
        "kind": "images",
        "path": str(scan.root),
        "family": family,
        "resolution": resolution,
        "images": len(scan.images),
        "readable": len(readable),
        "captioned": len(captions),
        "caption_extension": extension,
        "token_count": token_method,
        "buckets": [{"bucket": k, **v} for k, v in sorted(plan.items(), key=lambda kv: -kv[1]["images"])],
        "duplicates": {"exact": exact, "near": [{"a": a, "b": b, "distance": d} for a, b, d in near]},
    })
    report.extra.update({"root": scan.root, "infos": infos, "captions": captions, "placements": placements})
    return report
