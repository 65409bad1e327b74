"""Walk a dataset folder without ever leaving it, following a loop, or reading a file twice.

The walk sorts what it finds into images, caption files and trainer configs, and turns the
traps of real folders into findings: symlinks that point outside the dataset (a trainer on
the rented machine would not have their targets), symlink loops, macOS ``._`` shadow files,
formats trainers cannot read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lorapod.data.findings import Finding, finding, printable
from lorapod.errors import DataError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp")
# Image formats seen in datasets that the trainers (and lorapod's engine) do not read.
OTHER_IMAGE_EXTS = (".gif", ".bmp", ".tif", ".tiff", ".heic", ".heif", ".avif", ".jxl")
# Of those, what `lorapod data fix` converts to PNG: the formats Pillow reads without a plugin.
FIX_CONVERTS = (".gif", ".bmp", ".tif", ".tiff")
CAPTION_EXTS = (".txt", ".caption")
VIDEO_EXTS = (".mp4", ".webm", ".mov")  # video LoRA clips (lorapod.data.video checks them)
TOML_NAMES = ("dataset.toml", "dataset_config.toml", "config.toml")
# Trainer caches and notes that live next to the images and are not data.
QUIET_EXTS = (".npz", ".safetensors", ".json", ".md", ".toml", ".yaml", ".yml")


@dataclass
class Scan:
    """What a dataset folder holds, with paths relative to ``root`` for messages."""

    root: Path
    images: list[Path] = field(default_factory=list)
    captions: list[Path] = field(default_factory=list)
    tomls: list[Path] = field(default_factory=list)
    videos: list[Path] = field(default_factory=list)
    # images in a format trainers cannot read (already an ``image-format`` error; `data fix` converts
    # them): their captions are theirs, not orphans
    unreadable_images: list[Path] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def rel(self, path: Path) -> str:
        """The path as shown to people (and used as a key): relative, and printable even when the
        file name is not valid UTF-8."""
        try:
            text = path.relative_to(self.root).as_posix()
        except ValueError:
            text = str(path)
        return printable(text)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def scan_folder(root: Path) -> Scan:
    """Sort a dataset folder's files; raise DataError only when the folder itself is unusable."""
    root = Path(root)
    if not root.exists() and not root.is_symlink():
        raise DataError(f"{root} does not exist.", hint="Check the path; it should be the folder holding the images.")
    try:
        real_root = root.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise DataError(f"{root} cannot be opened: {exc}.", hint="Is it a broken or looping symlink?") from exc
    if not real_root.is_dir():
        if root.suffix.lower() in (".jsonl", ".json"):
            raise DataError(f"{root} is a chat data file; this command works on a folder of images (or clips).",
                            hint=f"check chat data with `lorapod data check {root} --model MODEL` (every problem "
                                 "with its fix)")
        raise DataError(f"{root} is a file, not a folder.", hint="Give the folder that holds the images (not one image).")
    scan = Scan(root=real_root)
    hidden = 0
    other: list[str] = []

    def on_error(exc: OSError) -> None:
        scan.findings.append(finding("error", "path-unreadable", exc.filename or root,
                                     f"cannot read: {exc.strerror}; check its permissions."))

    # followlinks=False: a symlinked folder is reported, never descended (no loops, no escapes).
    for dirpath, dirnames, filenames in os.walk(real_root, onerror=on_error, followlinks=False):
        here = Path(dirpath)
        for d in sorted(dirnames):
            p = here / d
            if d.startswith("."):
                dirnames.remove(d)
            elif p.is_symlink():
                scan.findings.append(finding(
                    "warning", "symlink-folder", scan.rel(p),
                    "symlinked folder not followed (trainers may not follow it either); copy its files in.",
                ))
        dirnames.sort()
        for name in sorted(filenames):
            p = here / name
            rel = scan.rel(p)
            if name.startswith("."):
                hidden += 1
                continue
            if p.is_symlink():
                try:
                    target = p.resolve(strict=True)
                except RuntimeError:
                    scan.findings.append(finding("error", "symlink-loop", rel,
                                                 "symlink loop: this link points back to itself; replace it with the file."))
                    continue
                except OSError as exc:
                    code = "symlink-loop" if exc.errno == 40 else "symlink-broken"
                    what = "symlink loop" if code == "symlink-loop" else "broken symlink (its target is missing)"
                    scan.findings.append(finding("error", code, rel, f"{what}; replace it with the real file."))
                    continue
                if not _inside(target, real_root):
                    scan.findings.append(finding(
                        "error", "path-escapes", rel,
                        f"symlink points outside the dataset folder ({target}); it would be missing once the "
                        "folder is uploaded: copy the file in instead. Not read.",
                    ))
                    continue
                if not target.is_file():
                    continue
            elif not p.is_file():
                scan.findings.append(finding("warning", "not-a-file", rel,
                                             "not a regular file (a pipe, socket or device); not read."))
                continue
            ext = p.suffix.lower()
            if ext in IMAGE_EXTS:
                scan.images.append(p)
            elif ext in CAPTION_EXTS:
                scan.captions.append(p)
            elif ext in VIDEO_EXTS:
                scan.videos.append(p)
            elif name.lower() in TOML_NAMES or (ext == ".toml" and here == real_root):
                scan.tomls.append(p)
            elif ext in OTHER_IMAGE_EXTS:
                scan.unreadable_images.append(p)
                fixable = ext in FIX_CONVERTS
                scan.findings.append(finding(
                    "error", "image-format", rel,
                    f"{ext} images are not read by the trainers; convert to PNG or JPEG"
                    + (" (`lorapod data fix` does)" if fixable else "") + " or remove it.",
                ))
            elif ext not in QUIET_EXTS:
                other.append(rel)
    if hidden:
        scan.findings.append(finding("info", "hidden-files", ".",
                                     f"{hidden} hidden files ignored (such as macOS ._ shadow files)."))
    if other:
        shown = ", ".join(other[:5]) + (" ..." if len(other) > 5 else "")
        scan.findings.append(finding("info", "other-files", ".", f"{len(other)} files that are neither images nor "
                                     f"captions ignored: {shown}"))
    return scan
