"""``lorapod demo --video`` end to end (shortened with --steps): a clip sampled, both files, caches reused."""

from __future__ import annotations

import pytest
from safetensors import safe_open

import lorapod.cli.main as cli_main
from lorapod.data.clips import probe
from lorapod.demo_video import run_video_demo

pytest.importorskip("av")


@pytest.mark.slow
def test_video_demo_samples_a_clip_writes_both_files_and_a_rerun_reuses_every_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    out = tmp_path / "demo"
    res = run_video_demo(out, steps=2, log=lambda m: None, show_progress=False)
    # 3 clips of 12 frames -> windows of 1, 5, 9 frames each, + 2 stills; 5 captions
    assert res.cache_hits == 0 and res.cache_misses == 11 + 5
    assert len(res.clips) == 1 and probe(res.clips[0]).frames == 9
    assert res.contact_sheets and res.diffusers_file.is_file()
    with safe_open(str(res.comfy_file), "pt") as fh:
        assert fh.metadata()["ss_base_model_version"] == "wan2.1"
        assert "lora_unet_blocks_0_self_attn_q.alpha" in set(fh.keys())
    cli_main.main(["demo", "--video", "--out", str(out), "--steps", "2"])
    shown = capsys.readouterr().out
    assert "LoRA, ComfyUI format" in shown and "16 reused, 0 encoded" in shown
