"""``lorapod data fix``: the mechanical fixes, applied so that no original is ever lost.

With ``--out`` the folder is copied and the copy is fixed; with ``--in-place`` every file is
copied into a backup folder *beside* the dataset (not inside it, where it would be uploaded and
trained on) before it is changed or renamed. Nothing is ever deleted, nothing is written through
a symlink, and a rename never replaces an existing file.
"""

from __future__ import annotations

import io
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lorapod.data.captionfiles import pair_captions
from lorapod.data.imageinfo import EXT_FORMAT, sniff
from lorapod.data.scan import FIX_CONVERTS, scan_folder
from lorapod.errors import DataError, require
from lorapod.fsutil import atomic_write_bytes, atomic_write_text


@dataclass
class FixResult:
    target: Path
    backup: Path | None
    actions: list[str] = field(default_factory=list)


class _Writer:
    """Writes into ``target``; in place, first copies the original into ``backup`` (once per file)."""

    def __init__(self, target: Path, backup: Path | None) -> None:
        self.target, self.backup = target, backup
        self.saved: set[Path] = set()

    def keep_original(self, path: Path) -> None:
        if self.backup is None or path in self.saved:
            return
        dest = self.backup / path.relative_to(self.target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        self.saved.add(path)

    def write_bytes(self, path: Path, data: bytes) -> None:
        self.keep_original(path)
        atomic_write_bytes(path, data)

    def write_text(self, path: Path, text: str) -> None:
        self.keep_original(path)
        atomic_write_text(path, text)

    def rename(self, src: Path, dst: Path) -> None:
        self.keep_original(src)
        if src.name.lower() == dst.name.lower():  # case-only rename: go through a temporary name
            tmp = src.with_name(f".{src.name}.rename-tmp")
            src.rename(tmp)
            tmp.rename(dst)
        else:
            src.rename(dst)


def _fix_image(path: Path) -> tuple[bytes, list[str]] | None:
    """The fixed image bytes and what changed, or None when the image needs nothing."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        fmt = im.format
        orientation = int(im.getexif().get(0x0112, 1) or 1)
        has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
        sixteen = im.mode.startswith("I;16") or im.mode in ("I", "F")
        if orientation in (0, 1) and im.mode != "CMYK" and not has_alpha and not sixteen:
            return None
        icc = im.info.get("icc_profile")
        im.load()
        changes = []
        if orientation not in (0, 1):
            im = ImageOps.exif_transpose(im)
            changes.append(f"rotated per EXIF orientation {orientation}")
        if im.mode == "CMYK":
            im = im.convert("RGB")
            icc = None  # the CMYK profile no longer describes the pixels
            changes.append("CMYK -> RGB")
        if sixteen:
            import numpy as np

            arr = np.asarray(im, dtype=np.float32)
            im = Image.fromarray(np.clip(arr / 257.0, 0, 255).astype(np.uint8), "L")
            changes.append("16-bit -> 8-bit")
        if has_alpha:
            rgba = im.convert("RGBA")
            flat = Image.new("RGB", rgba.size, (255, 255, 255))
            flat.paste(rgba, mask=rgba.getchannel("A"))
            im = flat
            changes.append("alpha flattened on white")
        buf = io.BytesIO()
        kwargs = {"icc_profile": icc} if icc else {}
        if fmt == "JPEG":
            im.convert("RGB").save(buf, "JPEG", quality=95, subsampling=0, **kwargs)
        elif fmt == "WEBP":
            im.save(buf, "WEBP", quality=95, **kwargs)
        else:
            im.save(buf, "PNG", **kwargs)
    return buf.getvalue(), changes


def _convert_formats(scan, writer: _Writer, result: FixResult) -> bool:
    """BMP/GIF/TIFF (which the trainers do not read) -> ``<stem>.png`` beside it; the original goes to
    the backup (in place) or stays only in the source folder (--out). A GIF keeps its first frame."""
    from PIL import Image

    done = False
    for p in scan.unreadable_images:
        rel = scan.rel(p)
        if p.is_symlink() or p.suffix.lower() not in FIX_CONVERTS:
            continue
        png = p.with_suffix(".png")
        if png.exists() or p.with_suffix(".PNG").exists():
            result.actions.append(f"{rel}: not converted, {png.name} already exists")
            continue
        try:
            with Image.open(p) as im:
                frames = getattr(im, "n_frames", 1)
                im.seek(0)
                rgb = im.convert("RGBA" if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info else "RGB")
        except Exception as exc:  # Pillow raises many kinds for a broken file; `check` reports it
            result.actions.append(f"{rel}: left as is (cannot decode: {exc})")
            continue
        if rgb.mode == "RGBA":
            flat = Image.new("RGB", rgb.size, (255, 255, 255))
            flat.paste(rgb, mask=rgb.getchannel("A"))
            rgb = flat
        buf = io.BytesIO()
        rgb.save(buf, "PNG")
        atomic_write_bytes(png, buf.getvalue())
        writer.keep_original(p)
        p.unlink()  # kept in the backup (in place) or in the source folder (--out)
        result.actions.append(f"{rel}: converted to {png.name}" + (f" (first of {frames} frames)" if frames > 1 else ""))
        done = True
    return done


def _rename_mismatched(scan, writer: _Writer, result: FixResult) -> bool:
    """A PNG named ``.jpg`` (and the like) gets the extension of what it is; its caption still pairs
    by stem. Never over an existing file."""
    ext_of = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}
    done = False
    for img in scan.images:
        if img.is_symlink():
            continue
        with open(img, "rb") as fh:
            real = sniff(fh.read(16))
        named = EXT_FORMAT.get(img.suffix.lower())
        if real not in ext_of or named is None or real == named:
            continue
        dst = img.with_suffix(ext_of[real])
        if dst.exists():
            result.actions.append(f"{scan.rel(img)}: not renamed, {dst.name} already exists")
            continue
        writer.rename(img, dst)
        result.actions.append(f"{scan.rel(img)}: a {real} file, renamed to {dst.name}")
        done = True
    return done


def normalise_caption(text: str, trigger: str | None) -> str:
    """One line (lines joined with commas), single spaces, the trigger first.

    A trigger that is a whole tag elsewhere (``a mug, zxq_mug``) is moved to the front; one
    inside a sentence is left where it is and the trigger is also prepended, since cutting a
    word out of a sentence would change its meaning.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    caption = re.sub(r"[ \t]+", " ", ", ".join(lines))
    if trigger:
        head = re.split(r"[,\s]+", caption, maxsplit=1)[0] if caption else ""
        if head != trigger:
            tags = [t.strip() for t in caption.split(",")]
            if trigger in tags:
                tags.remove(trigger)
            rest = ", ".join(t for t in tags if t)
            caption = f"{trigger}, {rest}" if rest else trigger
    return caption


def fix_dataset(
    path: Path,
    *,
    out: Path | None = None,
    in_place: bool = False,
    trigger: str | None = None,
    caption_extension: str = ".txt",
) -> FixResult:
    """Apply every safe fix to a copy (``out``) or in place with a backup; return what was done."""
    require("PIL", "data", "Fixing image datasets")
    src = Path(path)
    if (out is None) == (not in_place):
        raise DataError("say where the fixed dataset goes: --out NEW_FOLDER or --in-place (with a backup).",
                        hint="e.g. `lorapod data fix ./mug --out ./mug-fixed`.")
    if not caption_extension.startswith("."):
        caption_extension = "." + caption_extension
    scan = scan_folder(src)  # validates the folder
    root = scan.root
    if out is not None:
        target = Path(out).resolve()
        if target == root or target.is_relative_to(root):
            raise DataError(f"--out {out} is inside the dataset folder.", hint="Choose a folder outside it.")
        if target.exists() and any(target.iterdir()):
            raise DataError(f"--out {out} already exists and is not empty.", hint="Give a new folder name.")
        if target.exists():
            target.rmdir()
        shutil.copytree(root, target, symlinks=True)
        backup = None
    else:
        target = root
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = root.parent / f"{root.name}-backup-{stamp}"
        n = 1
        while backup.exists():
            n += 1
            backup = root.parent / f"{root.name}-backup-{stamp}-{n}"
    result = FixResult(target=target, backup=backup)
    writer = _Writer(target, backup)
    scan = scan_folder(target)
    if _convert_formats(scan, writer, result) | _rename_mismatched(scan, writer, result):
        scan = scan_folder(target)  # the new names are what the later fixes and the pairing see

    for img in scan.images:
        rel = scan.rel(img)
        if img.is_symlink():
            continue
        try:
            fixed = _fix_image(img)
        except Exception as exc:  # a corrupt image is reported by `check`; fix leaves it alone
            result.actions.append(f"{rel}: left as is (cannot decode: {exc})")
            continue
        if fixed is not None:
            data, changes = fixed
            writer.write_bytes(img, data)
            result.actions.append(f"{rel}: {', '.join(changes)}")

    pairing, _ = pair_captions(scan, caption_extension)
    for img, cap in pairing.captions.items():
        if cap is None or cap.is_symlink():
            continue
        rel = scan.rel(cap)
        wanted = img.with_name(img.stem + caption_extension)
        if cap != wanted:
            if wanted.exists() and wanted.name.lower() != cap.name.lower():
                result.actions.append(f"{rel}: not renamed, {wanted.name} already exists")
                continue
            writer.rename(cap, wanted)
            result.actions.append(f"{rel}: renamed to {wanted.name}")
            cap = wanted
        raw = cap.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            result.actions.append(f"{scan.rel(cap)}: left as is (not UTF-8; re-save it as UTF-8)")
            continue
        if any(ord(ch) < 32 and ch not in "\n\r\t" for ch in text):
            result.actions.append(f"{scan.rel(cap)}: left as is (binary data; rewrite it)")
            continue
        plain = normalise_caption(text, None)
        if not plain:  # nothing to keep: a trigger alone would hide the error, not fix it
            result.actions.append(f"{scan.rel(cap)}: left empty: write a caption (what the image shows besides the "
                                  "concept); `lorapod data check` still lists it")
            continue
        new = normalise_caption(text, trigger)
        if new and new + "\n" != text:
            what = []
            if plain + "\n" != text:
                what.append("whitespace and lines normalised")
            if plain != new:
                what.append(f"trigger {trigger!r} first")
            writer.write_text(cap, new + "\n")
            result.actions.append(f"{scan.rel(cap)}: {', '.join(what)}")
    return result
