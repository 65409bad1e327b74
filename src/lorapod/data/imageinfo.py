"""Decode one image once and measure everything the checks need: header, mode, size, EXIF
orientation, hashes, sharpness and exposure.

Called from a thread pool: Pillow releases the GIL while decoding, and JPEGs are decoded with
libjpeg's DCT scaling (``Image.draft``) to about 192 px on the short side, which is all the
statistics need and several times faster than a full decode. A truncated file still fails,
because the scaled decode reads every scan of the file.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

MAX_IMAGE_BYTES = 200 * 1024 * 1024  # nothing a trainer should get; never read into memory
MAX_PIXELS = 100_000_000  # 10k x 10k; larger is a decompression bomb or a scan
ANALYSIS_SIDE = 192  # short side the statistics are measured at (JPEG 1024x768 decodes at 1/4)

MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)
EXT_FORMAT = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP"}


def sniff(head: bytes) -> str | None:
    """The image format a file's first bytes announce, or None when they announce no image."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, name in MAGIC:
        if head.startswith(magic):
            return name
    return None


@dataclass
class ImageInfo:
    """Facts about one image; ``error`` set (with ``error_code``) when it cannot be used."""

    path: Path
    rel: str
    size_bytes: int = 0
    error: str | None = None
    error_code: str | None = None
    sniffed: str | None = None
    format: str | None = None
    mode: str | None = None
    width: int = 0
    height: int = 0
    orientation: int = 1
    bits: int = 8
    alpha: bool = False
    alpha_used: bool = False
    sha256: str | None = None
    phash: int | None = None
    sharpness: float | None = None
    brightness: float | None = None
    dark_fraction: float | None = None
    bright_fraction: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@lru_cache(maxsize=1)
def _dct_matrix(n: int = 32) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


def phash(gray) -> int:
    """64-bit perceptual hash: signs of the 8x8 lowest DCT frequencies of a 32x32 thumbnail.

    Re-encoding, resizing and small colour edits barely move it; a different photo flips about
    half the bits. Compare with ``hamming``.
    """
    from PIL import Image

    small = np.asarray(gray.resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    d = _dct_matrix(32)
    low = (d @ small @ d.T)[:8, :8].ravel()
    bits = low > np.median(low[1:])
    return int("".join("1" if b else "0" for b in bits), 2)


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def laplacian_variance(a: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian: low means few edges, i.e. blurred or featureless."""
    if a.shape[0] < 3 or a.shape[1] < 3:
        return 0.0
    lap = a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:] - 4 * a[1:-1, 1:-1]
    return float(lap.var())


def _png_bit_depth(data: bytes) -> int:
    # IHDR is always the first chunk: 8 signature + 4 length + 4 type + 4 width + 4 height, then depth.
    return data[24] if len(data) > 24 and data[12:16] == b"IHDR" else 8


def inspect_image(path: Path, rel: str) -> ImageInfo:
    """Measure one image. Never raises: every failure becomes ``error``/``error_code``."""
    info = ImageInfo(path=path, rel=rel)
    try:
        return _inspect(info)
    except Exception as exc:  # decoders raise OSError, SyntaxError, ValueError, struct.error... on bad bytes
        info.error_code = info.error_code or "image-corrupt"
        info.error = info.error or f"cannot decode: {exc}; re-export the image or remove it."
        return info


def _inspect(info: ImageInfo) -> ImageInfo:
    from PIL import Image

    path = info.path
    info.size_bytes = path.stat().st_size
    if info.size_bytes == 0:
        info.error_code, info.error = "image-empty", "the file is empty (0 bytes); remove it or copy it again."
        return info
    with open(path, "rb") as fh:
        head = fh.read(32)
    info.sniffed = sniff(head)
    if info.sniffed is None:
        info.error_code = "image-not-an-image"
        info.error = f"not an image: the file starts with {head[:8]!r}, not a JPEG/PNG/WebP header; remove it."
        return info
    if info.size_bytes > MAX_IMAGE_BYTES:
        info.error_code = "image-too-large"
        info.error = (f"{info.size_bytes / 2**20:.0f} MiB is far beyond any training image; "
                      "export it at a normal size (a few MiB at most). Not decoded.")
        return info
    data = path.read_bytes()
    info.sha256 = hashlib.sha256(data).hexdigest()
    with Image.open(io.BytesIO(data)) as im:
        info.format, info.mode = im.format, im.mode
        info.width, info.height = im.size
        if info.width * info.height > MAX_PIXELS:
            info.error_code = "image-too-large"
            info.error = f"{info.width}x{info.height} pixels; downscale it (a trainer would choke). Not decoded."
            return info
        info.orientation = int(im.getexif().get(0x0112, 1) or 1)
        if im.format == "PNG":
            info.bits = _png_bit_depth(data)
        if im.mode.startswith("I;16") or im.mode in ("I", "F"):
            info.bits = 16
        info.alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
        if im.format == "JPEG":
            short = min(im.size)
            if short > ANALYSIS_SIDE:
                f = ANALYSIS_SIDE / short
                im.draft("RGB" if im.mode != "L" else "L", (int(im.size[0] * f), int(im.size[1] * f)))
        im.load()
        if info.alpha:
            rgba = im.convert("RGBA")
            info.alpha_used = rgba.getchannel("A").getextrema()[0] < 255
        if info.bits == 16 and im.mode not in ("RGB", "RGBA", "L", "LA", "P"):
            arr = np.clip(np.asarray(im, dtype=np.float32) / 257.0, 0, 255)  # 65535 -> 255
            gray = Image.fromarray(arr.astype(np.uint8), "L")
        else:
            gray = im.convert("RGB").convert("L")
    w, h = gray.size
    short = min(w, h)
    if short > ANALYSIS_SIDE:
        f = ANALYSIS_SIDE / short
        gray = gray.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BILINEAR)
    a = np.asarray(gray, dtype=np.float32)
    info.sharpness = laplacian_variance(a)
    info.brightness = float(a.mean())
    info.dark_fraction = float((a < 16).mean())
    info.bright_fraction = float((a > 239).mean())
    # A flat image has no structure to hash: its DCT is float noise, and two flat images of
    # different colours would look like near duplicates.
    info.phash = phash(gray) if float(a.std()) >= 1.0 else None
    return info
