"""The held-out split: subject images kept out of training, the references the autopilot scores against.

Why: a checkpoint's images scored against the images it trained on reward copying (a LoRA that
redraws a training photo scores best; AnimaLoraStudio PR #319 split off a validation set for this
reason). So the references are images of the subject the run never saw: ``data.holdout_path``, or
a few of the subject's own images taken out of training (``data.holdout``).

Which ones: the subject images are those whose caption holds the trigger word (regularisation
images are not the subject), or all images when there is no trigger. They are ordered by their
content's SHA-256 and the first N are held out: the same images on every machine, in every copy of
the folder, and across a resume, whatever the file names.

How many (``auto``): none under :data:`AUTO_MIN` subject images (each one is needed to train, and
the run says so); else 10%, at least 1 and at most :data:`AUTO_MAX`. A run that holds none scores
adherence, leakage and memorisation but not fidelity, and its autopilot does not pick or stop
(quality/decide.py); the run log says which it is and how to give references.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: Fewer subject images than this: none held out by default.
AUTO_MIN = 8
#: The most images ``auto`` holds out.
AUTO_MAX = 8
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class Candidate:
    """An image that may be held out: its file, its caption, the SHA-256 of its bytes."""

    path: Path
    caption: str
    digest: str


@dataclass
class Holdout:
    held: list[Path] = field(default_factory=list)  # the references (held out, or from holdout_path)
    train: set[str] = field(default_factory=set)  # digests of the images that still train
    why: str = ""  # what was held out, or why none, in a sentence for the run log
    held_digests: set[str] = field(default_factory=set)  # digests of the held-out training images

    def to_json(self) -> dict:
        return {"held": [str(p) for p in self.held], "why": self.why, "count": len(self.held)}


def count(setting: str | int | float, subject: int) -> int:
    """How many of ``subject`` images ``data.holdout`` holds out."""
    if setting == "auto":
        if subject < AUTO_MIN:
            return 0
        return max(1, min(AUTO_MAX, round(subject * 0.1)))
    if isinstance(setting, float):  # a fraction (the spec allows 0 < x < 1); one image always trains
        return min(subject - 1, max(1, round(subject * setting))) if subject > 1 else 0
    return min(int(setting), max(0, subject - 1))


def split(candidates: list[Candidate], setting: str | int | float, trigger: str | None,
          holdout_path: str | None = None) -> Holdout:
    """Which images to hold out of ``candidates`` (every image of the run, with its caption)."""
    if holdout_path:
        refs = reference_images(Path(holdout_path))
        return Holdout(refs, {c.digest for c in candidates},
                       f"{len(refs)} reference image(s) from data.holdout_path {holdout_path}; every training image trains")
    trig = (trigger or "").strip().lower()
    subject = [c for c in candidates if not trig or trig in c.caption.lower()]
    n = count(setting, len(subject))
    what = f"subject images (captions with '{trigger}')" if trig else "images"
    if n == 0:
        if setting == "auto" and len(subject) < AUTO_MIN:
            why = (f"none held out: {len(subject)} {what}, fewer than {AUTO_MIN}, so each one trains; subject fidelity "
                   "is not scored and the autopilot does not pick or stop. Give reference photos the run does not "
                   "train on in data.holdout_path, or set data.holdout: 1")
        else:
            why = f"none held out (data.holdout: {setting}, {len(subject)} {what}); subject fidelity is not scored"
        return Holdout([], {c.digest for c in candidates}, why)
    held = sorted(subject, key=lambda c: c.digest)[:n]
    digests = {c.digest for c in held}
    names = ", ".join(c.path.name for c in sorted(held, key=lambda c: c.path.name))
    why = (f"{n} of {len(subject)} {what} held out as references, never trained on: {names} "
           f"(data.holdout: {setting}; chosen by content hash, the same on every machine)")
    return Holdout([c.path for c in sorted(held, key=lambda c: c.path.name)],
                   {c.digest for c in candidates if c.digest not in digests}, why, digests)


def reference_images(folder: Path, limit: int = 64) -> list[Path]:
    """The images in a references folder (``data.holdout_path``), sorted, at most ``limit``."""
    from lorapod.errors import DataError

    if not folder.is_dir():
        raise DataError(f"data.holdout_path {folder} is not a folder", hint="a folder of reference images of the subject")
    found = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTS and p.is_file())[:limit]
    if not found:
        raise DataError(f"data.holdout_path {folder} holds no image", hint=f"put {', '.join(IMAGE_EXTS)} files there")
    return found
