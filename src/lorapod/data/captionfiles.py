"""Caption files: pair them with images, read them safely, and check what they say.

The silent failures this catches are the ones that train for hours without captions: a
``caption_extension`` that does not match the files (sd-scripts falls back to ``.caption``),
``photo01.TXT`` on a case-sensitive file system, ``photo01.jpg.txt`` from a captioning script,
captions numbered one off by a chat model (an orphan caption *and* a missing one).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lorapod.data.findings import Finding, finding
from lorapod.data.scan import Scan
from lorapod.errors import ModelLoadError, require

MAX_CAPTION_BYTES = 64 * 1024
CLIP_WINDOW = 77  # tokens, BOS and EOS included
SD_SCRIPTS_DEFAULT_EXT = ".caption"  # what sd-scripts uses when a dataset.toml sets no caption_extension
REPEATED_CAPTION_MIN = 3


@dataclass
class Pairing:
    """image path -> its caption file (or None); captions that belong to no image."""

    captions: dict[Path, Path | None]
    orphans: list[Path]
    extension: str


def _caption_stem(caption: Path, image_names: set[str]) -> str:
    """``photo01.jpg.txt`` -> ``photo01.jpg`` is an image name, so the stem it means is ``photo01``."""
    stem = caption.stem
    if stem in image_names:
        return Path(stem).stem
    return stem


def dominant_extension(scan: Scan) -> str:
    """The caption extension most files use, spelled as on disk ('.txt' when there are none)."""
    counts = Counter(p.suffix for p in scan.captions)
    return counts.most_common(1)[0][0] if counts else ".txt"


def pair_captions(scan: Scan, extension: str) -> tuple[Pairing, list[Finding]]:
    """Match every image with its caption; name every near miss and every orphan."""
    findings: list[Finding] = []
    by_dir: dict[Path, list[Path]] = {}
    for c in scan.captions:
        by_dir.setdefault(c.parent, []).append(c)
    image_names = {p.name for p in scan.images}
    claimed: set[Path] = set()
    result: dict[Path, Path | None] = {}
    stems: dict[tuple[Path, str], Path] = {}
    for img in scan.images:
        other = stems.setdefault((img.parent, img.stem), img)
        if other is not img:
            findings.append(finding(
                "warning", "image-stem-clash", scan.rel(img),
                f"{img.name} and {other.name} share the name {img.stem!r} and so one caption; rename one.",
            ))
    exact_names = set(scan.captions)
    for img in scan.images:
        candidates = by_dir.get(img.parent, [])
        exact = img.with_name(img.stem + extension)
        if exact in exact_names and exact not in claimed:
            result[img] = exact
            claimed.add(exact)
            continue
        near = [c for c in candidates if c not in claimed and _caption_stem(c, image_names) == img.stem]
        if near:
            c = near[0]
            result[img] = c
            claimed.add(c)
            findings.append(finding(
                "error", "caption-extension", scan.rel(c),
                f"caption named {c.name} but trainers look for {exact.name}; rename it "
                "(`lorapod data fix` does).",
            ))
            continue
        folded = [c for c in candidates if c not in claimed and _caption_stem(c, image_names).lower() == img.stem.lower()]
        if folded:
            c = folded[0]
            result[img] = c
            claimed.add(c)
            findings.append(finding(
                "error", "caption-case-mismatch", scan.rel(c),
                f"caption {c.name} differs from image {img.name} only in letter case; on Linux the trainer "
                f"will not find it: rename it to {exact.name}.",
            ))
            continue
        result[img] = None
    # a caption of a BMP/GIF/... image belongs to that image (flagged image-format), not an orphan
    flagged = {(p.parent, p.stem) for p in scan.unreadable_images}
    orphans = [c for c in scan.captions if c not in claimed and (c.parent, _caption_stem(c, image_names)) not in flagged]
    any_caption = any(v is not None for v in result.values())
    for img, cap in result.items():
        if cap is None and any_caption:
            findings.append(finding(
                "error", "caption-missing", scan.rel(img),
                f"no caption: add {img.stem}{extension} (the image would train with an empty caption).",
            ))
    if scan.images and not any_caption:
        findings.append(finding(
            "warning", "no-captions", ".",
            "no image has a caption: the trainer falls back to the folder name or class token. "
            "Draft captions with `lorapod data caption DIR --with wd14`.",
        ))
    for c in orphans:
        findings.append(finding(
            "warning", "caption-orphan", scan.rel(c),
            f"no image named {c.stem}.*: a leftover caption, or captions numbered off by one; check the pairing.",
        ))
    exts = Counter(p.suffix for p in scan.captions)
    if len(exts) > 1:
        listed = ", ".join(f"{n} x {e}" for e, n in exts.most_common())
        findings.append(finding("warning", "caption-extension-inconsistent", ".",
                                f"caption files use several extensions ({listed}); use one ({extension})."))
    return Pairing(captions=result, orphans=orphans, extension=extension), findings


def toml_caption_extensions(path: Path, root: Path) -> tuple[list[tuple[str, str | None]], list[Finding]]:
    """(subset label, caption_extension) for each subset of a sd-scripts/musubi-tuner dataset.toml.

    The effective value follows sd-scripts' fallback: subset, then dataset, then [general];
    None means none is set (sd-scripts then uses '.caption').
    """
    rel = path.name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return [], [finding("error", "toml-invalid", rel, f"cannot parse {path.name}: {exc}; the trainer would refuse it.")]
    general = data.get("general", {}) if isinstance(data.get("general"), dict) else {}
    out: list[tuple[str, str | None]] = []
    datasets = data.get("datasets", [])
    if not isinstance(datasets, list):
        return [], [finding("error", "toml-invalid", rel, "'datasets' must be an array of tables ([[datasets]]).")]
    for i, ds in enumerate(datasets):
        if not isinstance(ds, dict):
            continue
        subsets = ds.get("subsets") or [{}]
        for j, sub in enumerate(subsets if isinstance(subsets, list) else [{}]):
            sub = sub if isinstance(sub, dict) else {}
            ext = sub.get("caption_extension") or ds.get("caption_extension") or general.get("caption_extension")
            image_dir = sub.get("image_dir") or ds.get("image_directory") or ds.get("image_dir")
            label = f"datasets[{i}].subsets[{j}]" + (f" (image_dir={image_dir})" if image_dir else "")
            out.append((label, ext))
    if not out and "caption_extension" in general:
        out.append(("general", general["caption_extension"]))
    return out, []


def check_toml(scan: Scan) -> tuple[str | None, list[Finding]]:
    """Compare each dataset.toml's caption_extension with the caption files actually present."""
    findings: list[Finding] = []
    if not scan.captions:
        return None, findings
    on_disk = dominant_extension(scan)
    for path in scan.tomls:
        subsets, errs = toml_caption_extensions(path, scan.root)
        findings.extend(errs)
        for label, ext in subsets:
            effective = ext or SD_SCRIPTS_DEFAULT_EXT
            if not effective.startswith("."):
                effective = "." + effective
            if effective != on_disk:
                why = (f"caption_extension = {ext!r}" if ext else
                       f"no caption_extension (sd-scripts then reads {SD_SCRIPTS_DEFAULT_EXT})")
                findings.append(finding(
                    "error", "toml-caption-extension", scan.rel(path),
                    f"{label}: {why}, but the captions here are {on_disk} files: the trainer would silently "
                    f"train without captions. Set caption_extension = \"{on_disk}\".",
                ))
    return on_disk, findings


@dataclass
class CaptionText:
    text: str | None
    findings: list[Finding]


def read_caption(path: Path, rel: str) -> CaptionText:
    """Caption text as trainers read it (sd-scripts keeps the first line), or findings saying why not."""
    size = path.stat().st_size
    if size > MAX_CAPTION_BYTES:
        return CaptionText(None, [finding("error", "caption-too-large", rel,
                                          f"{size} bytes is not a caption; is this the right file?")])
    raw = path.read_bytes()
    if any(b < 32 and b not in (9, 10, 13) for b in raw):
        return CaptionText(None, [finding("error", "caption-binary", rel,
                                          "holds control characters or binary data; rewrite the caption as plain text.")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return CaptionText(None, [finding(
            "error", "caption-not-utf8", rel,
            f"not UTF-8 (byte {exc.start} is 0x{raw[exc.start]:02x}); re-save it as UTF-8.",
        )])
    out: list[Finding] = []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return CaptionText("", [finding("error", "caption-empty", rel,
                                        "empty caption; write one (sd-scripts stops on an empty caption file).")])
    if len(lines) > 1:
        out.append(finding("warning", "caption-multiline", rel,
                           f"{len(lines)} lines; sd-scripts reads only the first: join them with commas."))
    first = text.splitlines()[0]
    if not first.strip():
        out.append(finding("error", "caption-empty", rel, "the first line is empty and trainers read only the first line."))
    elif first != first.strip() or text.rstrip("\r\n") != text.rstrip("\r\n").strip():
        out.append(finding("info", "caption-whitespace", rel,
                           "leading/trailing whitespace; harmless, `lorapod data fix` strips it."))
    return CaptionText(first.strip(), out)


def trigger_findings(text: str, trigger: str, rel: str) -> list[Finding]:
    """The trigger must be the first tag (``zxq_mug, ...`` or ``zxq_mug a mug on ...``)."""
    head = re.split(r"[,\s]+", text.strip(), maxsplit=1)[0] if text.strip() else ""
    if head == trigger:
        return []
    if re.search(rf"(?<![\w]){re.escape(trigger)}(?![\w])", text):
        return [finding("warning", "trigger-not-first", rel,
                        f"trigger {trigger!r} is not first; put it first (`lorapod data fix --trigger` does).")]
    return [finding("error", "trigger-missing", rel,
                    f"trigger {trigger!r} missing; start the caption with it (`lorapod data fix --trigger` adds it).")]


_PIECE = re.compile(r"[^\W\d_]+|\d|[^\w\s]+|_+", re.UNICODE)


def approx_clip_tokens(text: str) -> int:
    """CLIP token count without the tokenizer: BOS + EOS + one token per short word, digit or run
    of punctuation, and ceil(len/5) for words longer than 8 letters (CLIP's BPE keeps common
    words whole and splits rare long ones). Within a few tokens of the real count on English
    captions; use ``--tokenizer`` for the exact figure.
    """
    n = 2
    for piece in _PIECE.findall(text.lower()):
        n += math.ceil(len(piece) / 5) if piece.isalpha() and len(piece) > 8 else 1
    return n


def clip_counter(tokenizer_dir: Path | None) -> tuple[Callable[[str], int], str]:
    """A function counting CLIP tokens (BOS/EOS included) and a label saying how it counts."""
    if tokenizer_dir is None:
        return approx_clip_tokens, "approximation"
    transformers = require("transformers", "llm", "Counting CLIP tokens")
    folder = Path(tokenizer_dir)
    hint = ("Point --tokenizer at a folder with vocab.json and merges.txt (e.g. the 'tokenizer' "
            "folder of an SD/SDXL diffusers checkout).")
    # transformers 5 builds an empty tokenizer from a folder without vocabulary: refuse it here.
    if not ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()) and not (
        folder / "tokenizer.json"
    ).is_file():
        raise ModelLoadError(f"no CLIP tokenizer files in {folder}.", hint=hint)
    try:
        tok = transformers.CLIPTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/TypeError depending on what is missing
        raise ModelLoadError(
            f"cannot load a CLIP tokenizer from {tokenizer_dir}: {exc}",
            hint=hint,
        ) from exc
    return (lambda text: len(tok(text, truncation=False)["input_ids"])), f"tokenizer:{tokenizer_dir}"
