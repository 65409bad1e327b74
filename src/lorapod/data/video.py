"""``lorapod data check DIR --family <a video family>``: a folder of clips and images for a video LoRA.

Clips are probed with PyAV exactly as training reads them (``lorapod.data.clips``): the frame
count after resampling to ``fps`` and the windows of ``target_frames`` decide whether a clip is
too short; packet timestamps show a variable frame rate; a file with only audio, no frames, or
that FFmpeg cannot read is an error. Images go through the image checks (they train as 1-frame
videos), and captions are paired with clips and images alike. Same ``Report`` and findings JSON
as the image check; ``summary.kind`` is ``"video"``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from lorapod.catalog import families
from lorapod.data.buckets import make_buckets, place
from lorapod.data.captionfiles import (
    check_toml,
    dominant_extension,
    pair_captions,
    read_caption,
    trigger_findings,
)
from lorapod.data.clips import ClipError, probe, resample, windows
from lorapod.data.findings import Report, finding
from lorapod.data.scan import Scan, scan_folder
from lorapod.errors import require

MIN_VIDEO_SIDE = 480  # Wan trains at 480p and up; smaller clips are upscaled into blur
LONG_CLIP_S = 10.0


def check_video(root: Path, *, family: str = families.VIDEO[0], trigger: str | None = None,
                target_frames: tuple[int, ...] = (1, 17, 33), fps: float | None = 16.0,
                workers: int | None = None) -> Report:
    """Every check of a clips + images folder; ``summary.windows`` is the training window plan."""
    from lorapod.data.images import image_findings, inspect_all

    require("av", "video", "Checking video datasets")
    scan = scan_folder(root)
    report = Report()
    report.extend(scan.findings)
    media = sorted(scan.images + scan.videos)
    if not media:
        report.add(finding("error", "no-media", ".", "no clip (.mp4/.webm/.mov) or image in this folder; is it the right one?"))
    toml_ext, toml_findings = check_toml(scan)
    report.extend(toml_findings)
    extension = toml_ext or dominant_extension(scan)
    pairing, pair_findings = pair_captions(Scan(root=scan.root, images=media, captions=scan.captions), extension)
    report.extend(f for f in pair_findings if f.code != "no-captions")
    if media and not any(pairing.captions.values()):
        report.add(finding("error" if not trigger else "warning", "no-captions", ".",
                           f"none of the {len(scan.videos)} clips and {len(scan.images)} images has a {extension} "
                           "caption: a video LoRA needs one per file (or at least data.trigger)."))

    infos = inspect_all(scan.images, [scan.rel(p) for p in scan.images], workers)
    for info in infos:
        report.extend(image_findings(info, family))
    buckets = make_buckets(families.facts(family).resolution)
    plan: Counter[str] = Counter()
    for info in infos:
        if info.ok:
            plan[f"1x{place(info.width, info.height, buckets).bucket}"] += 1

    targets = sorted(set(target_frames))
    usable = 0
    clips: list[dict] = []
    for p in scan.videos:
        rel = scan.rel(p)
        try:
            ci = probe(p)
        except ClipError as exc:
            report.add(finding("error", exc.code, rel, f"{exc.message}; {exc.hint}"))
            continue
        src = resample(ci.frames, ci.fps, fps)
        cuts = windows(len(src), targets, "head")
        clips.append({"path": rel, "frames": ci.frames, "fps": round(ci.fps, 3), "size": [ci.width, ci.height],
                      "duration_s": round(ci.duration, 3), "variable_fps": ci.variable_fps, "audio": ci.has_audio})
        if ci.variable_fps:
            report.add(finding("error", "video-variable-fps", rel,
                               "variable frame rate: resampling to a fixed fps (and every trainer's frame count) "
                               "assumes a constant one; re-encode it (ffmpeg -i in.mp4 -r 16 -c:v libx264 out.mp4)."))
        if not cuts:
            report.add(finding("error", "video-too-short", rel,
                               f"{len(src)} frames at {fps or ci.fps:g} fps: shorter than every target "
                               f"({', '.join(map(str, targets))} frames); training skips it."))
            continue
        usable += 1
        if len(src) < targets[-1]:
            report.add(finding("warning", "video-short", rel,
                               f"{len(src)} frames at {fps or ci.fps:g} fps: too short for the {targets[-1]}-frame "
                               f"target, so it trains only as {', '.join(str(t) for t, _ in cuts)}-frame windows."))
        short = min(ci.width, ci.height)
        if short < MIN_VIDEO_SIDE:
            report.add(finding("warning", "video-low-resolution", rel,
                               f"{ci.width}x{ci.height}: short side {short} px < {MIN_VIDEO_SIDE} px; it is upscaled "
                               "into its bucket and the LoRA learns the blur."))
        if ci.duration > LONG_CLIP_S:
            report.add(finding("info", "video-long", rel,
                               f"{ci.duration:.1f} s long: with frame_extraction head only its start trains; use "
                               "uniform or slide, or cut it into shots."))
        bucket = place(ci.width, ci.height, buckets).bucket
        for t, _ in cuts:
            plan[f"{t}x{bucket}"] += 1

    for cap in pairing.captions.values():
        if cap is None:
            continue
        try:
            ct = read_caption(cap, scan.rel(cap))
        except OSError as exc:
            report.add(finding("error", "caption-unreadable", scan.rel(cap), f"cannot read: {exc.strerror}."))
            continue
        report.extend(ct.findings)
        if ct.text and trigger:
            report.extend(trigger_findings(ct.text, trigger, scan.rel(cap)))

    report.summary.update({
        "kind": "video",
        "path": str(scan.root),
        "family": family,
        "clips": len(scan.videos),
        "usable_clips": usable,
        "images": len(scan.images),
        "readable_images": sum(1 for i in infos if i.ok),
        "captioned": sum(1 for v in pairing.captions.values() if v is not None),
        "caption_extension": extension,
        "target_frames": targets,
        "fps": fps,
        "windows": [{"bucket": k, "windows": v} for k, v in plan.most_common()],
        "clip_info": clips,
    })
    report.extra.update({"root": scan.root, "infos": infos})
    return report
