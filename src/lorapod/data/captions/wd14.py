"""WD14 tagger (SmilingWolf's ONNX models): booru-style tags, run with onnxruntime on CPU or GPU.

The model folder holds ``model.onnx`` and ``selected_tags.csv`` (columns tag_id, name,
category, count; category 9 = rating, 4 = character, 0 = general). Input is NHWC float32 BGR
in 0-255, padded to a white square; output is one probability per tag.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorapod.data.captions.base import resolve_model_dir
from lorapod.errors import ModelLoadError, require

NAME = "wd14"
DESCRIPTION = "WD14 ONNX tagger (booru tags; default SmilingWolf/wd-swinv2-tagger-v3)"
DEFAULT_MODEL = "SmilingWolf/wd-swinv2-tagger-v3"
FILES = ["model.onnx", "selected_tags.csv"]
GENERAL_THRESHOLD = 0.35
CHARACTER_THRESHOLD = 0.85
RATING = 9
CHARACTER = 4
# Kaomoji tags keep their underscores (``^_^``); other tags read better with spaces.
KEEP_UNDERSCORES = {"0_0", "(o)_(o)", "+_+", "+_-", "._.", "<o>_<o>", "<|>_<|>", "=_=", ">_<", "3_3",
                    "6_9", ">_o", "@_@", "^_^", "o_o", "u_u", "x_x", "|_|", "||_||"}


@dataclass
class Tag:
    name: str
    category: int


def read_tags(path: Path) -> list[Tag]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        return [Tag(name=r["name"], category=int(r["category"])) for r in rows]
    except (OSError, KeyError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the tag list {path}: {exc}",
                             hint="selected_tags.csv needs the columns name and category.") from exc


class WD14Tagger:
    def __init__(self, folder: Path, general: float = GENERAL_THRESHOLD, character: float = CHARACTER_THRESHOLD):
        ort = require("onnxruntime", "caption", "The wd14 captioner")
        model, tags = folder / "model.onnx", folder / "selected_tags.csv"
        for f in (model, tags):
            if not f.is_file():
                raise ModelLoadError(f"{f} is missing.", hint=f"A WD14 model folder holds {' and '.join(FILES)}.")
        self.tags = read_tags(tags)
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        try:
            self.session = ort.InferenceSession(str(model), providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
            raise ModelLoadError(f"cannot load {model}: {exc}", hint="Is it a complete WD14 .onnx file?") from exc
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.size = int(inp.shape[1]) if isinstance(inp.shape[1], int) else 448
        self.fixed_batch = isinstance(inp.shape[0], int)
        out = self.session.get_outputs()[0]
        if isinstance(out.shape[-1], int) and out.shape[-1] != len(self.tags):
            raise ModelLoadError(f"the model predicts {out.shape[-1]} tags but selected_tags.csv lists {len(self.tags)}.",
                                 hint="Use the csv that came with this model.")
        self.general, self.character = general, character

    def preprocess(self, image) -> np.ndarray:
        from PIL import Image

        w, h = image.size
        side = max(w, h)
        square = Image.new("RGB", (side, side), (255, 255, 255))
        square.paste(image, ((side - w) // 2, (side - h) // 2))
        square = square.resize((self.size, self.size), Image.Resampling.BICUBIC)
        return np.asarray(square, dtype=np.float32)[:, :, ::-1]  # RGB -> BGR

    def tags_for(self, probs: np.ndarray) -> str:
        chosen = []
        for tag, p in zip(self.tags, probs.tolist(), strict=True):
            if tag.category == RATING:
                continue
            limit = self.character if tag.category == CHARACTER else self.general
            if p >= limit:
                chosen.append((p, tag.name if tag.name in KEEP_UNDERSCORES else tag.name.replace("_", " ")))
        chosen.sort(key=lambda t: -t[0])
        return ", ".join(name for _, name in chosen)

    def caption(self, images: list) -> list[str]:
        batch = np.stack([self.preprocess(im) for im in images])
        if self.fixed_batch:
            probs = np.concatenate([self.session.run(None, {self.input_name: batch[i:i + 1]})[0]
                                    for i in range(len(batch))])
        else:
            probs = self.session.run(None, {self.input_name: batch})[0]
        return [self.tags_for(row) for row in probs]


def load(model: str | None) -> WD14Tagger:
    require("onnxruntime", "caption", "The wd14 captioner")  # before fetching the model it needs
    return WD14Tagger(resolve_model_dir(model or DEFAULT_MODEL, FILES))
