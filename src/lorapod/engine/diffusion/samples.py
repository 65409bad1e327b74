"""Sample images while training: sd-scripts prompt files, PNGs with their settings inside, grids.

A prompts file has one prompt per line, with inline options as sd-scripts and kohya users write
them: ``zxq mug on a beach --w 1024 --h 1024 --d 42 --s 28 --l 7 --n blurry`` (width, height,
seed, steps, guidance scale, negative prompt). ``#`` starts a comment line. Every sample records
its prompt, seed and settings in the PNG's text chunks, so an image found later says how it was
made.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from lorapod.errors import SpecError

_OPT = re.compile(r"\s--([a-z]+)\s+")


@dataclass(frozen=True)
class SamplePrompt:
    prompt: str
    width: int
    height: int
    seed: int
    steps: int
    scale: float
    negative: str = ""


def parse_line(line: str, width: int, height: int, seed: int, steps: int, scale: float) -> SamplePrompt:
    """One sd-scripts prompt line; unknown options are an error that names them."""
    parts = _OPT.split(" " + line.strip())
    prompt = parts[0].strip()
    opts = dict(zip(parts[1::2], (p.strip() for p in parts[2::2]), strict=True))
    known = {"w", "h", "d", "s", "l", "n"}
    unknown = set(opts) - known
    if unknown:
        raise SpecError(f"sample prompt {line.strip()!r} has unknown option(s) {', '.join('--' + u for u in sorted(unknown))}",
                        hint="use --w WIDTH --h HEIGHT --d SEED --s STEPS --l GUIDANCE --n NEGATIVE")
    try:
        return SamplePrompt(
            prompt=prompt,
            width=int(opts.get("w", width)),
            height=int(opts.get("h", height)),
            seed=int(opts.get("d", seed)),
            steps=int(opts.get("s", steps)),
            scale=float(opts.get("l", scale)),
            negative=opts.get("n", ""),
        )
    except ValueError as exc:
        raise SpecError(f"sample prompt {line.strip()!r}: {exc}", hint="--w/--h/--d/--s take integers, --l a number") from exc


def load_prompts(source: str | list[str] | None, width: int, height: int, seed: int, steps: int,
                 scale: float) -> list[SamplePrompt]:
    if not source:
        return []
    if isinstance(source, str):
        p = Path(source).expanduser()
        if p.is_file():
            lines = p.read_text(encoding="utf-8-sig").splitlines()
        elif p.suffix.lower() in {".txt", ".prompts"}:  # meant as a file: never train with its name as a prompt
            raise SpecError(f"samples.prompts file {p} does not exist",
                            hint="fix the path (relative paths are read from the spec's folder), or give a list of prompts")
        else:
            lines = [source]
    else:
        lines = list(source)
    out = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(parse_line(line, width, height, seed, steps, scale))
    return out


def png_info(sp: SamplePrompt, step: int, epoch: int):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("prompt", sp.prompt)
    info.add_text("negative_prompt", sp.negative)
    info.add_text("seed", str(sp.seed))
    info.add_text("lorapod", json.dumps({**asdict(sp), "step": step, "epoch": epoch}))
    # A1111-style "parameters" so image browsers show it too
    info.add_text("parameters", f"{sp.prompt}\nNegative prompt: {sp.negative}\nSteps: {sp.steps}, CFG scale: {sp.scale}, "
                                f"Seed: {sp.seed}, Size: {sp.width}x{sp.height}")
    return info


#: background pixels between the cells of every grid, so neighbouring images never touch
GUTTER = 6
BACKGROUND = (255, 255, 255)


def grid(images: list, cols: int | None = None, gutter: int = GUTTER):
    """Images side by side (rows of ``cols``), each cell the size of the largest image and each
    image centred in its cell, with ``gutter`` background pixels between cells (none around the
    outside)."""
    from PIL import Image

    cols = cols or min(4, len(images))
    rows = (len(images) + cols - 1) // cols
    cw = max(i.width for i in images)
    ch = max(i.height for i in images)
    out = Image.new("RGB", (cols * cw + (cols - 1) * gutter, rows * ch + (rows - 1) * gutter), BACKGROUND)
    for n, im in enumerate(images):
        out.paste(im, ((n % cols) * (cw + gutter) + (cw - im.width) // 2, (n // cols) * (ch + gutter) + (ch - im.height) // 2))
    return out


def cell_boxes(size: tuple[int, int], rows: int, cols: int, gutter: int = GUTTER) -> list[list[tuple[int, int, int, int]]]:
    """(left, top, right, bottom) of each cell of a ``grid`` of ``size`` pixels, row by row."""
    cw = (size[0] + gutter) // max(1, cols)
    ch = (size[1] + gutter) // max(1, rows)
    return [[(j * cw, k * ch, j * cw + cw - gutter, k * ch + ch - gutter) for j in range(cols)] for k in range(rows)]


def labelled_grid(img, rows: list[str], cols: list[str], title: str, corner: str = "", gutter: int = GUTTER):
    """A grid that says what it shows, for when it is opened on its own (not through a page): the
    title on top, a label centred over each column and one at the left of each row, centred on it
    (lines split on "\n"); the margins grow to fit the longest label. ``corner`` names what the
    column labels are; ``gutter`` is the one ``grid`` left between the cells."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=12)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        font = ImageFont.load_default()
    boxes = cell_boxes(img.size, len(rows), len(cols), gutter)
    width = max([font.getlength(line) for r in rows for line in r.split("\n")] + [font.getlength(corner) + 6, 48.0])
    top = 20 + 14 * max([len(c.split("\n")) for c in cols] + [1])
    left = int(width) + 8
    out = Image.new("RGB", (max(img.width + left, int(font.getlength(title)) + 8), img.height + top), BACKGROUND)
    out.paste(img, (left, top))
    d = ImageDraw.Draw(out)
    d.text((4, 2), title, fill=(0, 0, 0), font=font)
    d.text((2, 18), corner, fill=(60, 60, 60), font=font)
    for j, c in enumerate(cols):
        x0, _, x1, _ = boxes[0][j]
        for n, line in enumerate(c.split("\n")):
            d.text((left + (x0 + x1 - font.getlength(line)) / 2, 18 + 14 * n), line, fill=(60, 60, 60), font=font)
    for k, r in enumerate(rows):
        _, y0, _, y1 = boxes[k][0]
        lines = r.split("\n")
        y = top + y0 + max(0, (y1 - y0) - 14 * len(lines)) // 2
        for n, line in enumerate(lines):
            d.text((2, y + 14 * n), line, fill=(0, 0, 0) if n == 0 else (60, 60, 60), font=font)
    return out


def sample_label(sp: SamplePrompt) -> str:
    """A sample's row label: the prompt, then how it was drawn."""
    return f"{sp.prompt}\nseed {sp.seed}, {sp.width}x{sp.height}, {sp.steps} steps, guidance {sp.scale:g}"


def labelled_samples(images: list, prompts: list[SamplePrompt], step: int, epoch: int, tag: str):
    """The training samples of one checkpoint, one row per prompt, labelled (prompt, seed, step,
    strength: training samples are drawn with the LoRA at strength 1)."""
    return labelled_grid(grid(images, cols=1), [sample_label(sp) for sp in prompts], [f"step {step}"],
                         f"{tag}: step {step}, epoch {epoch}, LoRA strength 1.0")
