"""``lorapod demo --video`` end to end: a clip per prompt, both files and cache reuse (shortened with
--steps), and that the full demo learns something a newcomer can see in its clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import lorapod.cli.main as cli_main
from lorapod.data.clips import probe, read_frames
from lorapod.demo_video import run_video_demo

pytest.importorskip("av")


@pytest.mark.slow
def test_video_demo_samples_a_clip_writes_both_files_and_a_rerun_reuses_every_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    out = tmp_path / "demo"
    res = run_video_demo(out, steps=2, log=lambda m: None, show_progress=False)
    # 3 concept clips -> windows of 1, 5, 9 frames each, + 2 stills, + 8 colour clips x 3 windows;
    # captions: the trigger and 8 colour names
    assert res.cache_hits == 0 and res.cache_misses == 11 + 24 + 9
    assert len(res.clips) == 3 and all(probe(c).frames == 9 for c in res.clips)
    assert res.progress is not None and res.progress.is_file()  # stopped before epoch 2: sampled at the stop
    assert res.contact_sheets and res.diffusers_file.is_file()
    with safe_open(str(res.comfy_file), "pt") as fh:
        assert fh.metadata()["ss_base_model_version"] == "wan2.1"
        assert "lora_unet_blocks_0_self_attn_q.alpha" in set(fh.keys())
    cli_main.main(["demo", "--video", "--out", str(out), "--steps", "2"])
    shown = capsys.readouterr().out
    assert "LoRA, ComfyUI format" in shown and "44 reused, 0 encoded" in shown
    assert "progress-clips.png" in " ".join(shown.split())


def _frames(path: Path) -> np.ndarray:
    return np.stack([np.asarray(f, np.float32) for f in read_frames(path, list(range(probe(path).frames)))])


def _share(frames: np.ndarray, rgb: tuple[int, int, int]) -> float:
    """The fraction of pixels (over every frame) within reach of a colour."""
    return float((np.abs(frames - np.array(rgb, np.float32)).sum(-1) < 90).mean())


def _motion(frames: np.ndarray) -> float:
    """Mean pixel change from frame 2 (the first of the second latent frame) to the last."""
    return float(np.abs(frames[-1] - frames[1]).mean())


RED, BLUE, GREEN = (220, 30, 30), (30, 60, 220), (30, 180, 60)


@pytest.mark.slow
def test_the_video_demo_clips_turn_into_the_trained_red_squares_on_blue_and_keep_the_other_prompt(tmp_path, monkeypatch):
    """The measure of "learns something visible" for video: the base draws flat grey for the
    trigger; after the demo's training both trigger clips are red squares on blue, standing still
    from frame to frame as the training clips do, while "green" (no trigger) stays green."""
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    res = run_video_demo(tmp_path / "demo", log=lambda m: None, show_progress=False)
    s = res.run / "samples"
    train = [_frames(p) for p in sorted((tmp_path / "demo" / "data" / "4_zxq").glob("*.mp4"))]
    assert all(0.2 < _share(f, RED) < 0.3 and _share(f, BLUE) > 0.7 and _motion(f) < 3 for f in train)
    base = [_frames(s / f"base-{k:02d}.mp4") for k in range(3)]
    final = [_frames(s / f"epoch006-{k:02d}.mp4") for k in range(3)]
    got = {name: [(round(_share(f, RED), 3), round(_share(f, BLUE), 3), round(_motion(f), 1)) for f in clips]
           for name, clips in (("base", base), ("final", final))}
    for red, blue, _ in got["base"][:2]:
        assert red < 0.02 and blue < 0.2, got  # the base draws no red squares on blue for a word it does not know
    for red, blue, moved in got["final"][:2]:
        assert 0.04 < red < 0.45 and blue > 0.5 and moved < 8, got  # ... the LoRA does, and they stand still
    assert _share(base[2], GREEN) > 0.8 and _share(final[2], GREEN) > 0.8, got
    assert res.progress is not None and res.progress.is_file()
