"""The quality autopilot in every family lorapod's engine trains, beyond SD 1.5 and Wan (test_quality_engine.py,
the video demo): Z-Image and Qwen-Image (images) and HunyuanVideo 1.5 (the generic video path), each a
tiny random pipeline of the real diffusers classes, scored by the tiny random scorers. What is tested is
the plumbing each family brings: the recipe draws at strength 0 with the LoRA off and at 1 with it on,
at the prompt's own seed, and each checkpoint gets its record against the base and a pick."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from lorapod.rundir import RunDir
from lorapod.rundir import quality as files
from lorapod.spec import load_spec

from .image_fixtures import image_spec, train_cpu, write_images

torch.set_num_threads(1)

QUALITY = {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "steps": 1, "strengths": [1.0],
           "prompts": ["zxq on a beach --w 32 --h 32", "a bowl of fruit --w 32 --h 32"]}


def _refs(data, tmp_path):
    refs = tmp_path / "refs"
    refs.mkdir()
    shutil.copy(sorted(data.glob("*.png"))[0], refs / "ref.png")
    return refs


def _check(run, out, frames: int) -> None:
    scores = files.read_scores(run.root)
    assert [r["step"] for r in scores] == [2, 4], files.read_json(run.root, files.PICK)
    entry = scores[-1]["strengths"]["1"]
    assert set(entry["fidelity_by"]) == {"dino", "clip_i"} and isinstance(entry["score"], float)
    assert entry["prompts"] == {"fidelity": 1, "leakage": 1}
    assert files.read_json(run.root, files.PICK)["checkpoint"] in ("step-2", "step-4")
    # strength 0 is the base: the LoRA off; 1 draws differently (its B given weight here)
    recipe = out.recipe
    with torch.no_grad():
        for m in recipe.lora_modules.values():
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    sp = recipe.score_prompts[0]
    base, again, tuned = recipe.render(sp, 0.0), recipe.render(sp, 0.0), recipe.render(sp, 1.0)
    assert len(base) == len(tuned) == frames and base[0].size == (32, 32)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(base, again, strict=True))  # its own seed
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(base, tuned, strict=True))


@pytest.mark.parametrize("family", ["zimage", "qwenimage"])
def test_image_families_are_scored_against_the_base(tmp_path, family):
    from lorapod.engine.diffusion.families.qwenimage import tiny as qwen_tiny
    from lorapod.engine.diffusion.families.zimage import tiny as zimage_tiny

    model = {"zimage": zimage_tiny, "qwenimage": qwen_tiny}[family].build(tmp_path / family)
    data = write_images(tmp_path / "data", n=4)
    raw = image_spec(model, data, tmp_path / "runs", family, max_steps=4)
    raw["data"]["holdout_path"] = str(_refs(data, tmp_path))
    # two sampling steps: Qwen-Image's scheduler stretches its timesteps to shift_terminal (0.02), which a
    # single step divides by zero (diffusers' FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal)
    raw["quality"] = {**QUALITY, "steps": 2}
    raw["save"] = {"every_steps": 2, "every_epochs": None, "keep_last": 5}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    _check(run, train_cpu(spec, run, tmp_path), frames=1)


def test_hunyuanvideo15_is_scored_on_clips_against_the_base(tmp_path):
    pytest.importorskip("av")
    from lorapod.demo_video import write_clips
    from lorapod.engine.diffusion.families.hunyuanvideo15 import tiny

    model = tiny.build(tmp_path / "hv15")
    data = write_clips(tmp_path / "data", n=2, frames=8, sizes=[(48, 48)], images=1)
    raw = {"model": {"id": str(model), "family": "hunyuanvideo15"}, "method": {"r": 4, "alpha": 8, "dropout": 0.0},
           "data": {"path": str(data), "format": "video", "resolution": 64, "trigger": "zxq", "target_frames": [1, 5],
                    "fps": 16, "holdout_path": str(_refs(data, tmp_path))},
           "train": {"max_steps": 4, "micro_batch_size": 1, "learning_rate": 1e-2, "seed": 0, "scheduler": "constant",
                     "precision": "fp32"},
           "eval": {"max_batches": 1}, "save": {"every_steps": 2, "keep_last": 5}, "quality": QUALITY,
           "output": {"dir": str(tmp_path / "runs"), "name": "t"}}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    _check(run, train_cpu(spec, run, tmp_path), frames=5)  # the longest trained window
