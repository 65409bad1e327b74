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
    top = sheet.height - 2 * 48
    assert top >= 34 and sheet.getpixel((left + 10, top + 10)) == (30, 60, 220)
    assert sheet.getpixel((left + 10, top + 48 + 10)) == (30, 180, 60)
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
