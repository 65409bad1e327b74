"""Run folders for the dashboard's tests, laid out as the engine and the session write them
(rundir.py; samples as engine/diffusion/recipe.py names them, with the prompt in a PNG text
chunk as engine/diffusion/samples.py writes it; eval/eval.json as evaluate/llm.py writes it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from PIL import Image
from PIL.PngImagePlugin import PngInfo

HOSTILE = "<script>alert('x')</script>"


def run_folder(parent: Path, name: str = "zxq-demo-20261201-120000-ab12", steps: int = 20, total: int = 100,
               samples: int = 2, usd_per_hour: float | None = None) -> Path:
    root = parent / name
    (root / "checkpoints").mkdir(parents=True)
    (root / "samples").mkdir()
    spec = {"model": {"id": "lorapod:tiny-sd15", "family": "sd15"}, "data": {"path": str(parent / "data")},
            "train": {"max_steps": total}, "output": {"dir": str(parent), "name": "zxq-demo"}}
    if usd_per_hour is not None:
        spec["compute"] = {"usd_per_hour": usd_per_hour}
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    write_metrics(root, range(1, steps + 1))
    (root / "checkpoints" / "step-10").mkdir()
    for k in range(samples):
        info = PngInfo()
        info.add_text("prompt", f"zxq {HOSTILE} mug #{k}")
        Image.new("RGB", (16, 16), (40 * k % 255, 90, 160)).save(root / "samples" / f"step{10:06d}-{k:02d}.png",
                                                                 pnginfo=info)
    (root / "events.log").write_text(f"2026-12-01T12:00:00 started {HOSTILE}\n")
    return root


def write_metrics(root: Path, steps, t0: float | None = None) -> None:
    t0 = t0 or time.time()
    with open(root / "metrics.jsonl", "a") as fh:
        for s in steps:
            fh.write(json.dumps({"time": t0 + s, "step": s, "loss": 1.0 / s, "lr": 1e-4, "step_time_s": 0.5}) + "\n")
