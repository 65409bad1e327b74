"""``lorapod data check PATH``: what the path is decides which check runs.

A folder is an image dataset (``data/images.py``), or a video one (clips and stills,
``data/video.py``) when the family is Wan; a ``.jsonl`` file is chat data (``data/chat.py``).
``lorapod data check``, the pre-flight of ``lorapod run`` and the dashboard's data page all call
``check_path``, so they judge one path alike. It sits above the three checks it dispatches to,
so none of them imports another to be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapod.catalog import families
from lorapod.data.chat import check_chat
from lorapod.data.findings import Report
from lorapod.data.images import check_images
from lorapod.data.video import check_video
from lorapod.errors import DataError, LorapodError
from lorapod.spec import JobSpec


def spec_check_args(spec: JobSpec) -> dict[str, Any]:
    """What a job spec says about how its data is judged: the family (the catalog's for ``auto``)
    and trigger word for images and clips; the sequence length, validation file and a local
    model's tokenizer for chat data. ``lorapod plan``, the pre-flight of ``lorapod run`` and the
    dashboard pass these, so a spec's data is judged as ``lorapod data check --family F --trigger T``
    judges it."""
    if spec.is_image:
        family = spec.model.family
        if family not in families.FAMILIES:
            from lorapod.catalog.models import find_model

            try:
                family = find_model(spec.model.id, spec.model.family, spec.model.variant).family
            except LorapodError:
                family = families.DEFAULT_IMAGE_FAMILY
        if family not in families.FAMILIES:
            family = families.DEFAULT_IMAGE_FAMILY
        return {"family": family, "trigger": spec.data.trigger, "target_frames": tuple(spec.data.target_frames),
                "fps": spec.data.fps}
    val = Path(spec.data.val_path) if spec.data.val_path else None
    model = Path(spec.model.id) if Path(spec.model.id).is_dir() else None
    return {"sequence_len": spec.data.sequence_len, "val": val, "model": model}


def check_path(path: Path, **kwargs) -> Report:
    """Dispatch on what ``path`` is: a folder of images or a chat JSONL file."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise DataError(f"{path} does not exist.", hint="Give an image folder or a .jsonl chat file.")
    if path.is_dir() and kwargs.get("family") in families.VIDEO:  # clips + images (lorapod.data.video)
        allowed = {k: v for k, v in kwargs.items() if k in ("family", "trigger", "target_frames", "fps", "workers")}
        return check_video(path, **allowed)
    if path.is_dir():
        allowed = {k: v for k, v in kwargs.items() if k in ("family", "trigger", "tokenizer", "workers")}
        return check_images(path, **allowed)
    if path.suffix.lower() not in (".jsonl", ".json"):
        raise DataError(f"{path} is neither a folder nor a .jsonl file.",
                        hint="Give the folder of images (not one image), or a chat .jsonl file.")
    allowed = {k: v for k, v in kwargs.items() if k in ("model", "sequence_len", "val", "system_prompt",
                                                        "max_line_bytes")}
    return check_chat(path, **allowed)
