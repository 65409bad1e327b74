"""``lorapod demo --image`` end to end (shortened with --steps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from lorapod.demo_image import run_image_demo


def test_image_demo_writes_both_formats_and_a_rerun_reuses_every_cache(tmp_path):
    out = tmp_path / "demo"
    res = run_image_demo(out, steps=2, log=lambda m: None, show_progress=False)
    assert res.cache_hits == 0 and res.cache_misses == 22  # 8 images x (plain, flipped) + 6 captions
    with safe_open(str(res.kohya_file), "pt") as fh:
        assert fh.metadata()["ss_base_model_version"] == "sd_v1"
        assert any(k.endswith(".alpha") for k in fh.keys())  # noqa: SIM118 (safe_open is not iterable)
    assert res.diffusers_file.is_file()
    assert (out / "data" / "2_zxq" / "img00.txt").read_text().startswith("zxq")
    # through the CLI: the base model is rebuilt identically, so nothing is encoded again
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "lorapod", "demo", "--image", "--out", str(out), "--steps", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "LoRA, kohya format" in proc.stdout and "22 reused, 0 encoded" in proc.stdout
