"""Every sample grid and contact sheet says what it shows when opened on its own: the prompt, the
seed and how it was drawn at the left of each row, the step and LoRA strength on top."""

from __future__ import annotations

import numpy as np
from PIL import Image

from lorapod.engine.diffusion import samples as smp
from lorapod.engine.diffusion.video import contact_sheet


def _inked(img: Image.Image, box: tuple[int, int, int, int]) -> int:
    """Pixels in ``box`` that are not the white background (text drawn there)."""
    a = np.asarray(img.crop(box).convert("L"))
    return int((a < 200).sum())


def _prompt(text: str, seed: int) -> smp.SamplePrompt:
    return smp.parse_line(f"{text} --w 64 --h 48 --d {seed} --s 8 --l 1", 64, 64, 0, 20, 7.0)


def test_a_training_sample_grid_labels_each_row_and_the_step_and_strength_on_top():
    cells = [Image.new("RGB", (64, 48), (30, 60, 220)), Image.new("RGB", (64, 48), (30, 180, 60))]
    sps = [_prompt("zxq", 1), _prompt("a photo of a green field at dusk", 2)]
    sheet = smp.labelled_samples(cells, sps, step=40, epoch=2, tag="epoch002")
    # the cells are pasted unchanged, right of a margin wide enough for the longest prompt
    left = sheet.width - 64
    assert left > len("a photo of a green field at dusk") * 4
    top = sheet.height - 2 * 48 - smp.GUTTER
    assert top >= 34 and sheet.getpixel((left + 10, top + 10)) == (30, 60, 220)
    assert sheet.getpixel((left + 10, top + 48 + smp.GUTTER + 10)) == (30, 180, 60)
    for row in range(2):  # a label beside each row, and the title above all
        assert _inked(sheet, (0, top + row * 48, left, top + (row + 1) * 48)) > 20
    assert _inked(sheet, (0, 0, sheet.width, 16)) > 50
    assert "seed 2, 64x48, 8 steps" in smp.sample_label(sps[1])


def test_a_video_contact_sheet_labels_each_clip_and_its_frames():
    clips = [np.full((9, 48, 64, 3), 200, np.uint8), np.full((5, 48, 64, 3), 90, np.uint8)]
    bare = contact_sheet(clips)
    sheet = contact_sheet(clips, ["zxq, a red square sliding right\nseed 1", "zxq\nseed 2"], "epoch003: step 9")
    assert sheet.width > bare.width and sheet.height > bare.height
    left, top = sheet.width - bare.width, sheet.height - bare.height
    for row in range(2):
        assert _inked(sheet, (0, top + row * 48, left, top + (row + 1) * 48)) > 20
    assert _inked(sheet, (left, 14, sheet.width, top)) > 20  # the frame numbers over the columns


def _ink_centre(img: Image.Image, band: tuple[int, int, int, int]) -> float:
    """The x centre of the text drawn in ``band`` (mean column of its dark pixels)."""
    a = np.asarray(img.crop(band).convert("L"))
    cols = np.nonzero((a < 200).any(axis=0))[0]
    assert cols.size, f"no label in {band}"
    return band[0] + (cols.min() + cols.max()) / 2


def test_every_grid_has_gutters_and_its_column_labels_centred_over_their_cells():
    cells = [Image.new("RGB", (64, 48), c) for c in [(200, 30, 30), (30, 60, 220), (30, 180, 60)] * 2]
    g = smp.GUTTER
    assert g >= 4
    plain = smp.grid(cells, cols=3)
    assert plain.size == (3 * 64 + 2 * g, 2 * 48 + g)
    # the gutters between cells (columns and rows) are background, the cells are untouched
    for x in (64, 64 + g - 1, 2 * 64 + g):
        assert {plain.getpixel((x, y)) for y in range(plain.height)} == {smp.BACKGROUND}
    assert {plain.getpixel((x, 48)) for x in range(plain.width)} == {smp.BACKGROUND}
    assert plain.getpixel((64 + g, 0)) == (30, 60, 220) and plain.getpixel((0, 48 + g)) == (200, 30, 30)
    # column labels of very different widths, each centred over its own cell
    labels = ["0.6", "step 40 ep 2", "1"]
    sheet = smp.labelled_grid(plain, ["row one", "row two"], labels, "title", corner="strength")
    left, top = sheet.width - plain.width, sheet.height - plain.height
    for j, box in enumerate(smp.cell_boxes(plain.size, 2, 3)[0]):
        x0, x1 = left + box[0], left + box[2]
        centre = _ink_centre(sheet, (x0 - g // 2, 16, min(sheet.width, x1 + g // 2), top - 1))
        assert abs(centre - (x0 + x1) / 2) <= 2.5, (labels[j], centre, x0, x1)
        assert x0 <= centre < x1
    # a smaller image sits in the middle of its cell, so the label centred over the cell is over it
    mixed = smp.grid([Image.new("RGB", (64, 48), (200, 30, 30)), Image.new("RGB", (32, 24), (30, 60, 220))], cols=2)
    assert mixed.getpixel((64 + g + 16, 12)) == (30, 60, 220) and mixed.getpixel((64 + g + 15, 11)) == smp.BACKGROUND
    # the contact sheet of a video has the same gutters between its frames and clips
    clips = [np.full((3, 48, 64, 3), 200, np.uint8), np.full((3, 48, 64, 3), 90, np.uint8)]
    sheet = contact_sheet(clips)
    assert sheet.size == (3 * 64 + 2 * g, 2 * 48 + g) and sheet.getpixel((64 + 1, 10)) == smp.BACKGROUND
