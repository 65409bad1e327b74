"""Run folders for the dashboard's tests, laid out as the engine and the session write them
(rundir/; samples as rundir/layout.py names them, with the prompt in a PNG text
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
               samples: int = 2, usd_per_hour: float | None = None, scale: float = 1.0,
               image_eval: bool = False) -> Path:
    root = parent / name
    (root / "checkpoints").mkdir(parents=True)
    (root / "samples").mkdir()
    spec = {"model": {"id": "lorapod:tiny-sd15", "family": "sd15"}, "data": {"path": str(parent / "data")},
            "train": {"max_steps": total}, "output": {"dir": str(parent), "name": "zxq-demo"}}
    if usd_per_hour is not None:
        spec["compute"] = {"usd_per_hour": usd_per_hour}
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    write_metrics(root, range(1, steps + 1), scale=scale)
    (root / "checkpoints" / "step-10").mkdir()
    for k in range(samples):
        info = PngInfo()
        info.add_text("prompt", f"zxq {HOSTILE} mug #{k}")
        picture(k).save(root / "samples" / f"step{10:06d}-{k:02d}.png", pnginfo=info)
    if image_eval:  # what evaluate/images.py writes: eval/images.json and one grid per prompt
        (root / "eval" / "images").mkdir(parents=True)
        grid = Image.new("RGB", (3 * 64, 2 * 64), "white")
        for i in range(6):
            grid.paste(picture(i), (64 * (i % 3), 64 * (i // 3)))
        grid.save(root / "eval" / "images" / "00-grid.png")
        (root / "eval" / "images.json").write_text(json.dumps({
            "grids": [{"prompt": "zxq mug on a beach", "seed": 42, "leakage_prompt": False,
                       "grid": "images/00-grid.png", "cells": []}], "strengths": [0.6, 0.8, 1.0], "clip": None}))
    (root / "events.log").write_text(f"2026-12-01T12:00:00 started {HOSTILE}\n")
    return root


def picture(k: int, size: int = 64) -> Image.Image:
    """A small distinct picture per index: a coloured disc on a tinted ground."""
    from PIL import ImageDraw

    im = Image.new("RGB", (size, size), (230 - 20 * (k % 5), 235, 240 - 15 * (k % 3)))
    d = ImageDraw.Draw(im)
    r = size // 4 + (k % 3) * 3
    c = (size // 2 + (k % 4) * 3 - 4, size // 2 - (k % 2) * 6 + 2)
    d.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], fill=((70 * k) % 255, 80 + (30 * k) % 150, 180))
    return im


def write_metrics(root: Path, steps, t0: float | None = None, scale: float = 1.0) -> None:
    t0 = t0 or time.time()
    with open(root / "metrics.jsonl", "a") as fh:
        for s in steps:
            loss = scale / s ** 0.5 + 0.05 * ((s * 7919) % 13) / 13  # a falling curve with some noise
            fh.write(json.dumps({"time": t0 + s, "step": s, "loss": loss, "lr": 1e-4 * min(1.0, s / 10),
                                 "step_time_s": 0.5}) + "\n")


def write_quality(root: Path, scores: dict[int, float], pick: int, stopped: int | None = None) -> None:
    """What the quality autopilot writes (quality/autopilot.py, through rundir/quality.py): a scores line
    per checkpoint, its line in metrics.jsonl after that step's training line (steps up to the last
    checkpoint are written here), the pick, and the early stop."""
    from lorapod.quality.decide import pick as decide_pick
    from lorapod.rundir import quality as files

    recs = []
    done = 0
    for step, score in sorted(scores.items()):
        write_metrics(root, range(done + 1, step + 1))
        done = step
        with open(root / "metrics.jsonl", "a") as fh:
            rec = {"step": step, "checkpoint": f"step-{step}", "seconds": 1.0,
                   "models": {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2"},
                   "strengths": {"0.8": {"score": score, "se": 0.01, "fidelity": score + 0.02},
                                 "1": {"score": score - 0.01, "se": 0.01}}}
            files.append_score(root, rec)
            recs.append(rec)
            fh.write(json.dumps({"step": step, "event": "quality", "quality_score": score,
                                 "quality_fidelity": score + 0.02, "quality_strength": 0.8}) + "\n")
    decision = decide_pick(recs)
    assert decision["step"] == pick, decision
    files.write_json(root, files.PICK, decision)
    if stopped is not None:
        files.write_json(root, files.STOPPED, {"step": stopped, "reason": f"plateau {HOSTILE}", "steps_saved": 40,
                                               "seconds_saved": 1800.0, "planned_steps": 100})
