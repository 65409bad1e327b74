"""Reading video clips with PyAV: what a clip holds (probe), which frames a window uses, the frames.

One module for both readers of clips, ``lorapod data check`` and the video engine, so the check
sees exactly what training will see: the same frame count (after resampling to the training
frame rate), the same windows, the same refusal of a file PyAV cannot decode.

Frame counting demuxes packets (no decoding), so probing a folder of long clips is quick; the
packets' timestamps also show a variable frame rate, which breaks fps resampling.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from lorapod.data.scan import VIDEO_EXTS
from lorapod.errors import DataError, require

__all__ = ["VIDEO_EXTS", "ClipError", "ClipInfo", "probe", "read_frames", "resample", "windows", "write_clip"]
VFR_TOLERANCE = 0.25  # a frame interval more than 25% off the median one means a variable frame rate


class ClipError(DataError):
    """A clip PyAV cannot open or decode, or one with no video stream."""

    def __init__(self, message: str, code: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.code = code


@dataclass(frozen=True)
class ClipInfo:
    """What a clip holds, read from its container and packet timestamps."""

    frames: int
    fps: float
    width: int
    height: int
    duration: float  # seconds
    variable_fps: bool
    has_audio: bool
    codec: str


def _av():
    return require("av", "video", "Reading video clips")


def probe(path: Path) -> ClipInfo:
    """Open a clip and count its frames from the packets; ClipError when it is not a usable video."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            has_audio = bool(container.streams.audio)
            if not container.streams.video:
                code = "video-audio-only" if has_audio else "video-no-stream"
                what = "only audio" if has_audio else "no video stream"
                raise ClipError(f"{path.name} has {what}", code, "remove it, or replace it with the video it belongs to")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            width, height = ctx.width, ctx.height
            pts = [p.pts for p in container.demux(stream) if p.pts is not None and p.size > 0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            tb = float(stream.time_base) if stream.time_base else 0.0
            codec = ctx.name
    except ClipError:
        raise
    except (av.FFmpegError, OSError, ValueError, UnicodeDecodeError) as exc:
        raise ClipError(f"PyAV cannot read {path.name} ({exc.__class__.__name__}: {exc})", "video-unreadable",
                        "re-encode it (e.g. ffmpeg -i in.mov -c:v libx264 out.mp4) or remove it") from exc
    if not pts:
        raise ClipError(f"{path.name} has a video stream with no frames", "video-no-frames", "remove or re-export it")
    pts.sort()
    deltas = [b - a for a, b in pairwise(pts) if b > a]
    variable = False
    if len(deltas) >= 2:
        med = statistics.median(deltas)
        variable = any(abs(d - med) > VFR_TOLERANCE * med for d in deltas)
    fps = float(rate) if rate else (1.0 / (statistics.median(deltas) * tb) if deltas and tb else 0.0)
    duration = (pts[-1] - pts[0]) * tb + (1.0 / fps if fps else 0.0)
    return ClipInfo(len(pts), fps, width, height, duration, variable, has_audio, codec)


def resample(n_frames: int, src_fps: float, fps: float | None) -> list[int]:
    """Source frame indices of the clip played at ``fps``: frame k is the source frame nearest to
    time k/fps. ``fps`` None, or within 1% of the source, keeps every frame."""
    if fps is None or src_fps <= 0 or abs(src_fps - fps) <= 0.01 * fps:
        return list(range(n_frames))
    out: list[int] = []
    k = 0
    while True:
        idx = round(k * src_fps / fps)
        if idx >= n_frames:
            return out
        out.append(idx)
        k += 1


def windows(n: int, targets: list[int], mode: str, sample: int = 1, stride: int = 10) -> list[tuple[int, int]]:
    """(frame count, start) of each training window over ``n`` (resampled) frames, as musubi-tuner
    cuts them: ``head`` one window per target from frame 0, ``uniform`` ``sample`` windows evenly
    spaced over the clip, ``slide`` a window every ``stride`` frames. Targets longer than the clip
    give no window."""
    out: list[tuple[int, int]] = []
    for t in sorted(set(targets)):
        if t > n:
            continue
        last = n - t
        if mode == "head":
            starts = [0]
        elif mode == "uniform":
            starts = sorted({round(i * last / (sample - 1)) for i in range(sample)} if sample > 1 else {0})
        elif mode == "slide":
            starts = list(range(0, last + 1, stride))
        else:
            raise ValueError(f"unknown frame extraction {mode!r}")
        out.extend((t, s) for s in starts)
    return out


def read_frames(path: Path, indices: list[int]):
    """The listed source frames (decode order = presentation order for these files) as RGB PIL images."""
    av = _av()
    wanted = set(indices)
    last = max(indices)
    got = {}
    try:
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in wanted:
                    got[i] = frame.to_image()
                if i >= last:
                    break
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise ClipError(f"PyAV cannot decode {path.name} ({exc})", "video-unreadable",
                        "re-encode it or remove it; `lorapod data check` lists every such clip") from exc
    missing = wanted - set(got)
    if missing:
        raise ClipError(f"{path.name} decoded {len(got)} of the frames its packets promised (missing {sorted(missing)[:3]})",
                        "video-unreadable", "re-encode the clip; it is damaged or truncated")
    return [got[i] for i in indices]


def reference_image(path: Path):
    """A reference (or training file) as the image the quality scorers see: an image, or a clip's
    first frame (a video run's references and training files are clips)."""
    from PIL import Image

    if Path(path).suffix.lower() in VIDEO_EXTS:
        return read_frames(Path(path), [0])[0].convert("RGB")
    with Image.open(path) as im:
        return im.convert("RGB")


def write_clip(path: Path, frames, fps: float = 16.0, codec: str | None = None) -> Path:
    """Write RGB frames (uint8 HxWx3 arrays) as a clip: H.264 in .mp4/.mov when the FFmpeg build has
    it, else MPEG-4 part 2; VP9 in .webm. Sides are rounded down to even numbers (yuv420p)."""
    import numpy as np

    av = _av()
    from fractions import Fraction

    arrs = [np.asarray(f, dtype=np.uint8) for f in frames]
    h, w = (arrs[0].shape[0] // 2) * 2, (arrs[0].shape[1] // 2) * 2
    if codec is None:
        if path.suffix.lower() == ".webm":
            codec = "libvpx-vp9"
        else:
            codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for a in arrs:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(a[:h, :w]), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
