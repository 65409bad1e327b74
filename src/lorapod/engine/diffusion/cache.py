"""Disk caches of VAE latents and text-encoder outputs, shared between runs.

Keys are content, not names: a latent is filed under the sha256 of the image's bytes, its bucket,
whether it is flipped and the model's identity (family, id, VAE config); a text-encoder output
under the caption's hash and the encoders' identity. A second run on the same data and model
therefore reads everything back and never runs the VAE encoder; change one image and only that
image is encoded again. Files are written atomically, so a crash never leaves a half file that a
later run would trust.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from lorapod.fsutil import atomic_write_bytes
from lorapod.home import lorapod_home


def default_cache_root() -> Path:
    """``LORAPOD_CACHE_DIR`` (set on an instance with a network volume, so a second session reuses
    the latents) or ``$LORAPOD_HOME/cache``, then ``diffusion/``."""
    import os

    root = os.environ.get("LORAPOD_CACHE_DIR")
    return (Path(root) if root else lorapod_home() / "cache") / "diffusion"


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}))


def _read(path: Path) -> dict[str, torch.Tensor] | None:
    try:
        return load_file(str(path))
    except Exception:  # a damaged file is re-encoded, not trusted
        return None


class DiskCache:
    """One folder per model identity: ``latents/`` and ``text/``; ``hits``/``misses`` count reuse."""

    def __init__(self, root: Path, identity: str) -> None:
        self.root = Path(root) / identity
        self.hits = 0
        self.misses = 0

    def latent_path(self, digest: str, bucket: tuple[int, int], flip: bool) -> Path:
        return self.root / "latents" / f"{digest[:32]}_{bucket[0]}x{bucket[1]}{'_flip' if flip else ''}.safetensors"

    def text_path(self, caption: str) -> Path:
        h = hashlib.sha256(caption.encode("utf-8")).hexdigest()[:32]
        return self.root / "text" / f"{h}.safetensors"

    def texts(self, captions: Iterable[str], encode: Callable[[list[str]], list[dict[str, torch.Tensor]]],
              batch: int = 8) -> dict[str, dict[str, torch.Tensor]]:
        """Text-encoder outputs per caption: read from ``text/`` or encoded (in batches) and stored."""
        keys = {c: self.text_path(c) for c in sorted(set(captions))}
        caption_of = {v: k for k, v in keys.items()}
        got = self.get_many(keys.values(), lambda ps: encode([caption_of[p] for p in ps]), batch=batch)
        return {c: got[p] for c, p in keys.items()}

    def get_many(self, keys: Iterable[Path], encode: Callable[[list[Path]], list[dict[str, torch.Tensor]]],
                 batch: int = 4) -> dict[Path, dict[str, torch.Tensor]]:
        """Read what exists; call ``encode`` on the rest (in batches) and store it."""
        out: dict[Path, dict[str, torch.Tensor]] = {}
        missing: list[Path] = []
        for k in dict.fromkeys(keys):
            got = _read(k) if k.is_file() else None
            if got is None:
                missing.append(k)
            else:
                out[k] = got
                self.hits += 1
        for s in range(0, len(missing), batch):
            chunk = missing[s : s + batch]
            for k, tensors in zip(chunk, encode(chunk), strict=True):
                _write(k, tensors)
                out[k] = {n: t.detach().cpu() for n, t in tensors.items()}
                self.misses += 1
        return out

