"""``lorapod demo --video``: the whole Wan video path offline on CPU, in well under a minute.

Builds a tiny Wan2.1 (or, with ``wan22``, a two-expert Wan2.2) ``WanPipeline`` from configs
(random ``WanTransformer3DModel``, ``AutoencoderKLWan`` and umT5 encoder, a tokenizer written in
code: nothing is downloaded), draws a few clips of a coloured square moving across a plain
background plus two still images, trains a LoRA with cached latents and umT5 outputs, samples a
clip (MP4 + contact sheet) and writes the diffusers and ComfyUI files. A random tiny model draws
noise; what the demo shows is the machinery. The pipeline is built by ``lorapod.builtin.wan``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorapod.builtin.wan import build_wan

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}


def moving_square(n: int, size: tuple[int, int], colour: tuple[int, int, int], bg: tuple[int, int, int],
                  speed: int = 2) -> list[np.ndarray]:
    w, h = size
    side = min(w, h) // 3
    frames = []
    for i in range(n):
        a = np.empty((h, w, 3), np.uint8)
        a[:] = bg
        x = (i * speed) % max(1, w - side)
        y = (h - side) // 2
        a[y : y + side, x : x + side] = colour
        frames.append(a)
    return frames


def write_clips(folder: Path, n: int = 3, frames: int = 12, fps: float = 16.0, trigger: str = "zxq",
                sizes: list[tuple[int, int]] | None = None, images: int = 2, seed: int = 0) -> Path:
    """Clips of a coloured square sliding right (plus ``images`` stills), captions starting with the trigger."""
    from PIL import Image

    from lorapod.data.clips import write_clip

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = sizes or [(64, 48), (48, 64), (48, 48)]
    names = list(COLOURS)
    for i in range(n):
        name = names[i % 3]
        bg = tuple(int(x) for x in rng.integers(150, 255, 3))
        write_clip(folder / f"clip{i:02d}.mp4", moving_square(frames, sizes[i % len(sizes)], COLOURS[name], bg), fps)
        (folder / f"clip{i:02d}.txt").write_text(f"{trigger}, a {name} square sliding right", encoding="utf-8")
    for j in range(images):
        name = names[j % 3]
        first = moving_square(1, sizes[j % len(sizes)], COLOURS[name], (200, 200, 200))[0]
        Image.fromarray(first).save(folder / f"still{j:02d}.png")
        (folder / f"still{j:02d}.txt").write_text(f"{trigger}, a {name} square", encoding="utf-8")
    return folder


@dataclass
class VideoDemoResult:
    out: Path
    run: Path
    first_loss: float | None
    last_loss: float | None
    clips: list[Path]
    contact_sheets: list[Path]
    diffusers_file: Path
    comfy_file: Path
    cache_hits: int
    cache_misses: int


DEMO_PROMPTS = ["zxq, a red square sliding right --w 48 --h 48 --f 9 --d 1 --s 4 --l 1"]


def demo_spec_dict(out: Path, model_id: str, steps: int | None, family: str = "wan21") -> dict:
    return {
        "model": {"id": model_id, "family": family},
        "method": {"type": "lora", "r": 4, "alpha": 4, "dropout": 0.0},
        "data": {"path": str(out / "data" / "2_zxq"), "format": "video", "resolution": 64, "trigger": "zxq",
                 "target_frames": [1, 5, 9], "frame_extraction": "head", "fps": 16},
        "train": {"epochs": 3, "max_steps": steps, "micro_batch_size": 1, "learning_rate": 5e-3,
                  "scheduler": "constant_with_warmup", "warmup_steps": 2, "precision": "auto", "seed": 42,
                  "timestep_sampling": "shift", "timestep_shift": 3.0},
        "eval": {"max_batches": 1},
        "save": {"every_epochs": 3, "keep_last": 1},
        "samples": {"prompts": str(out / "prompts.txt"), "every_epochs": 3},
        "output": {"dir": str(out / "runs"), "name": "zxq-video-demo"},
    }


def run_video_demo(out: Path, steps: int | None = None, log=print, show_progress: bool | None = None,
                   family: str = "wan21") -> VideoDemoResult:
    import torch
    import yaml

    from lorapod.engine.diffusion import quiet, train_diffusion
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quiet()
    torch.set_num_threads(1)  # models this small run fastest on one thread
    log(f"building a tiny {family} WanPipeline locally (random weights, no download)...")
    model_dir = out / "base-model"
    if not (model_dir / "model_index.json").is_file():
        build_wan(model_dir, family)
    data = out / "data" / "2_zxq"
    # kept when present: the caches are keyed by the clips' bytes, and an H.264 re-encode of the same
    # frames is not always byte-identical on a loaded machine
    if not (data / "clip02.mp4").is_file():
        shutil.rmtree(data, ignore_errors=True)
        write_clips(data, n=3, frames=12, images=2, seed=1)
    (out / "prompts.txt").write_text("# sd-scripts syntax + --f FRAMES (4n+1)\n" + "\n".join(DEMO_PROMPTS) + "\n",
                                     encoding="utf-8")
    raw = demo_spec_dict(out, str(model_dir), steps, family)
    (out / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    spec = load_spec(raw=raw)
    run = RunDir.create(out / "runs", "zxq-video-demo")
    run.write_spec(spec)
    log(f"run folder: {run.root}")
    trained = train_diffusion(spec, run, log=log, show_progress=show_progress)
    if not any(run.samples.glob("*.mp4")):  # stopped (--steps) before the epoch that samples: sample now
        trained.recipe.write_samples(trained.result.state, f"step{trained.result.state.step:06d}")
    first = (trained.result.first_eval or {}).get("fixed_noise_loss")
    last = (trained.result.last_eval or {}).get("fixed_noise_loss")
    (out / "result.json").write_text(json.dumps({"fixed_noise_loss": [first, last], "run": str(run.root)}),
                                     encoding="utf-8")
    return VideoDemoResult(out, run.root, first, last, sorted(run.samples.glob("*.mp4")),
                           sorted(run.samples.glob("*-frames.png")), run.adapter / "pytorch_lora_weights.safetensors",
                           run.adapter / "zxq-video-demo.safetensors", trained.cache_hits, trained.cache_misses)
