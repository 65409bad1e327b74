"""``lorapod demo --image`` end to end: both formats and cache reuse (shortened with --steps), and
that the full demo learns something a newcomer can see in its samples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from safetensors import safe_open

from lorapod.demo_image import run_image_demo


def test_image_demo_writes_both_formats_and_a_rerun_reuses_every_cache(tmp_path):
    out = tmp_path / "demo"
    res = run_image_demo(out, steps=2, log=lambda m: None, show_progress=False)
    # 8 concept images + 8 flat colours, each plain and flipped; 2 concept captions + 8 colour names
    assert res.cache_hits == 0 and res.cache_misses == 16 * 2 + 10
    with safe_open(str(res.kohya_file), "pt") as fh:
        assert fh.metadata()["ss_base_model_version"] == "sd_v1"
        assert any(k.endswith(".alpha") for k in fh.keys())  # noqa: SIM118 (safe_open is not iterable)
    assert res.diffusers_file.is_file()
    assert (out / "data" / "4_zxq" / "img00.txt").read_text().startswith("zxq")
    assert res.progress is not None and res.progress.is_file()  # stopped before epoch 2: sampled at the stop
    assert [p.name for p in res.samples] == [f"base-{k:02d}.png" for k in range(3)] + [f"step000002-{k:02d}.png" for k in range(3)]
    # the sheet shows a training image beside the samples: the disc for the two zxq rows, the flat green
    from lorapod.builtin.sd import TOY_COLOURS
    from lorapod.demo_image import CONCEPT_FG, training_images

    refs = training_images(out)
    assert [p.parent.name for p in refs] == ["4_zxq", "4_zxq", "1_colours"]
    px = Image.open(res.progress).convert("RGB").getdata()
    assert sum(1 for p in px if p == CONCEPT_FG) > 1500 and sum(1 for p in px if p == TOY_COLOURS["green"]) > 5000
    # through the CLI: the base model folder is reused, so nothing is encoded again
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "lorapod", "demo", "--image", "--out", str(out), "--steps", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "LoRA, kohya format" in proc.stdout and "42 reused, 0 encoded" in proc.stdout
    shown = " ".join(proc.stdout.split())
    assert "progress-grid.png" in shown and "says nothing about the quality a real base model reaches" in shown


def _disc(path: Path) -> float:
    """How much redder the centre of a picture is than its border: ~170 for the training images (a
    red disc on blue), ~0 for a flat colour."""
    a = np.asarray(Image.open(path).convert("RGB"), np.float32)
    h, w = a.shape[:2]
    yy, xx = np.mgrid[:h, :w]
    r = np.hypot(yy - h / 2 + 0.5, xx - w / 2 + 0.5) / min(h, w)
    return float(a[r < 0.2, 0].mean() - a[r > 0.4, 0].mean())


def _mean(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), np.float32).reshape(-1, 3).mean(0)


def test_the_demo_samples_grow_the_trained_disc_with_the_trigger_and_keep_the_other_prompt(tmp_path):
    """The measure of "learns something visible": the base draws flat colour for every prompt; after
    the demo's training the two trigger prompts ("zxq") grow a red centre on their own, as the
    training images have, while "green" (no trigger) keeps its flat colour."""
    res = run_image_demo(tmp_path / "demo", log=lambda m: None, show_progress=False)
    s = res.run / "samples"
    train = [_disc(p) for p in sorted((tmp_path / "demo" / "data" / "4_zxq").glob("*.png"))]
    assert min(train) > 120
    base = [_disc(s / f"base-{k:02d}.png") for k in range(3)]
    assert max(abs(b) for b in base) < 8  # flat colour: no disc before the LoRA
    final = [_disc(s / f"epoch008-{k:02d}.png") for k in range(3)]
    assert min(final[:2]) > 15 and np.mean(final[:2]) > 20, final
    assert final[2] < 10, final  # green without the trigger: no disc ...
    moved = [float(np.linalg.norm(_mean(s / f"epoch008-{k:02d}.png") - _mean(s / f"base-{k:02d}.png"))) for k in range(3)]
    assert moved[2] < 60 and moved[2] * 2 < min(moved[:2]), moved  # ... and much less change than the trigger's
    g = _mean(s / "epoch008-02.png")
    assert g[1] > g[0] + 60 and g[1] > g[2] + 60  # still green
    sheet = Image.open(res.progress)
    assert sheet.width > 5 * 64 and sheet.height > 3 * 48  # base + 4 checkpoints per row, labelled margins
