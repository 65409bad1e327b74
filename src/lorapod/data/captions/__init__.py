"""Draft captioners, registered by name through one registry, and the folder loop that runs them.

A backend is a factory ``(model: str | None) -> Captioner``; the built-ins (``wd14``, ``blip``,
``florence2``, ``joycaption``) register through the same ``register`` call a plugin would use, and a second
registration of a name is refused so two backends can never silently shadow each other.
Heavy imports (onnxruntime, transformers) happen inside the factories, only when used.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lorapod.data.captions.base import Captioner
from lorapod.errors import DataError

Factory = Callable[[str | None], Captioner]
_REGISTRY: dict[str, tuple[Factory, str]] = {}


def register(name: str, factory: Factory, description: str) -> None:
    """Add a captioner backend; a name can be registered once."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"captioner name {name!r} must be a plain word")
    if name in _REGISTRY:
        raise ValueError(f"a captioner named {name!r} is already registered")
    _REGISTRY[name] = (factory, description)


def available() -> dict[str, str]:
    """Registered backend names and what each does."""
    _load_builtins()
    return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def get_captioner(name: str, model: str | None = None) -> Captioner:
    _load_builtins()
    if name not in _REGISTRY:
        raise DataError(f"unknown captioner {name!r}.", hint=f"Use one of: {', '.join(sorted(_REGISTRY))}.")
    return _REGISTRY[name][0](model)


_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    from lorapod.data.captions import blip, florence2, joycaption, wd14

    for mod in (wd14, blip, florence2, joycaption):
        register(mod.NAME, mod.load, mod.DESCRIPTION)


@dataclass
class CaptionRun:
    written: int
    skipped: int
    failed: list[str]
    backup: Path | None


def _load_rgb(path: Path):
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
            rgba = im.convert("RGBA")
            flat = Image.new("RGB", rgba.size, (255, 255, 255))
            flat.paste(rgba, mask=rgba.getchannel("A"))
            return flat
        return im.convert("RGB")


def caption_folder(
    path: Path,
    name: str,
    *,
    model: str | None = None,
    trigger: str | None = None,
    overwrite: bool = False,
    batch_size: int = 8,
    caption_extension: str = ".txt",
    progress: bool = True,
) -> CaptionRun:
    """Write a draft caption next to every image that has none (every image with ``overwrite``).

    Existing captions are never replaced without ``overwrite``, and with it each one is first
    copied to a backup folder beside the dataset.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from lorapod.data.captionfiles import pair_captions
    from lorapod.data.fix import normalise_caption
    from lorapod.data.scan import scan_folder
    from lorapod.fsutil import atomic_write_text

    if batch_size < 1:
        raise DataError("--batch-size must be at least 1.")
    if not caption_extension.startswith("."):
        caption_extension = "." + caption_extension
    scan = scan_folder(Path(path))
    if not scan.images:
        raise DataError(f"no images in {path}.", hint="Give the folder holding the .jpg/.png/.webp files.")
    pairing, _ = pair_captions(scan, caption_extension)
    todo = [img for img, cap in pairing.captions.items() if overwrite or cap is None]
    skipped = len(scan.images) - len(todo)
    run = CaptionRun(written=0, skipped=skipped, failed=[], backup=None)
    if not todo:
        return run
    captioner = get_captioner(name, model)
    if overwrite:
        run.backup = scan.root.parent / f"{scan.root.name}-caption-backup-{time.strftime('%Y%m%d-%H%M%S')}"
    with Progress(TextColumn("captioning"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), disable=not progress, transient=True) as bar:
        task = bar.add_task("caption", total=len(todo))
        for start in range(0, len(todo), batch_size):
            batch_paths = todo[start:start + batch_size]
            images, kept = [], []
            for p in batch_paths:
                try:
                    images.append(_load_rgb(p))
                    kept.append(p)
                except Exception:  # unreadable images are reported by `lorapod data check`
                    run.failed.append(scan.rel(p))
            drafts = captioner.caption(images) if images else []
            for p, draft in zip(kept, drafts, strict=True):
                existing = pairing.captions.get(p)
                dest = p.with_name(p.stem + caption_extension)
                for old in {existing, dest} - {None}:
                    if old is not None and old.exists() and run.backup is not None:
                        target = run.backup / scan.rel(old)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(old, target)
                text = normalise_caption(draft, trigger) or (trigger or "")
                atomic_write_text(dest, text + "\n")
                run.written += 1
            bar.advance(task, len(batch_paths))
    return run
