"""``lorapod demo --image``: the whole image path offline on CPU, in about a minute.

Builds a tiny Stable-Diffusion-style pipeline from configs (random weights, a CLIP tokenizer
written in code: nothing is downloaded), draws a small dataset of a coloured shape with a
trigger word, trains a LoRA with cached latents and text-encoder outputs, writes samples and
both LoRA formats. The images a random tiny model draws are noise; what the demo shows is the
machinery: caching, buckets, loss going down, samples with metadata, ComfyUI-ready files.
The pipeline is built by ``lorapod.builtin.sd``, as the test suite's are.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from lorapod.builtin.sd import build_sd15


def write_images(folder: Path, n: int = 6, trigger: str = "zxq", sizes: list[tuple[int, int]] | None = None,
                 seed: int = 0) -> Path:
    """Coloured squares/circles on plain backgrounds with captions that start with the trigger."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = sizes or [(48, 48), (64, 40), (40, 64)]
    colours = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60)}
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        name, rgb = list(colours.items())[i % 3]
        bg = tuple(int(x) for x in rng.integers(150, 255, 3))
        img = Image.new("RGB", (w, h), bg)
        from PIL import ImageDraw

        d = ImageDraw.Draw(img)
        m = min(w, h) // 4
        shape = "square" if i % 2 == 0 else "circle"
        box = (w // 2 - m, h // 2 - m, w // 2 + m, h // 2 + m)
        (d.rectangle if shape == "square" else d.ellipse)(box, fill=rgb)
        img.save(folder / f"img{i:02d}.png")
        (folder / f"img{i:02d}.txt").write_text(f"{trigger}, a {name} {shape}", encoding="utf-8")
    return folder


@dataclass
class ImageDemoResult:
    out: Path
    run: Path
    first_loss: float | None
    last_loss: float | None
    samples: list[Path]
    diffusers_file: Path
    kohya_file: Path
    cache_hits: int
    cache_misses: int


DEMO_PROMPTS = ["zxq, a red circle --w 64 --h 64 --d 1 --s 8 --l 1",
                "zxq, a red circle on a blue background --w 80 --h 48 --d 2 --s 8 --l 1",
                "a photo of a cat --w 64 --h 64 --d 3 --s 8 --l 1"]


def demo_spec_dict(out: Path, model_id: str, steps: int | None) -> dict:
    return {
        "model": {"id": model_id, "family": "sd15"},
        "method": {"type": "lora", "r": 8, "alpha": 8, "dropout": 0.0},
        "data": {"path": str(out / "data" / "2_zxq"), "format": "images", "resolution": 64, "flip": True,
                 "trigger": "zxq"},
        "train": {"epochs": 8, "max_steps": steps, "micro_batch_size": 2, "learning_rate": 1e-2,
                  "scheduler": "constant_with_warmup", "warmup_steps": 4, "precision": "auto", "seed": 42},
        "eval": {"max_batches": 2},
        "save": {"every_epochs": 2, "keep_last": 2},
        "samples": {"prompts": str(out / "prompts.txt"), "every_epochs": 2},
        "output": {"dir": str(out / "runs"), "name": "zxq-demo"},
    }


def run_image_demo(out: Path, steps: int | None = None, log=print, show_progress: bool | None = None) -> ImageDemoResult:
    import yaml

    from lorapod.engine.diffusion import train_diffusion
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from lorapod.engine.diffusion import quiet

    quiet()
    torch.set_num_threads(1)  # models this small run fastest on one thread (more only contend)
    log("building a tiny Stable-Diffusion-style pipeline locally (random weights, no download)...")
    model_dir = build_sd15(out / "base-model", seed=0)
    data = out / "data" / "2_zxq"  # kohya folder name: 2 repeats of each image
    if data.exists():
        shutil.rmtree(data)
    write_images(data, n=8, sizes=[(96, 96), (128, 80), (80, 128), (112, 112)], seed=1)
    (out / "prompts.txt").write_text("# sd-scripts syntax: --w --h --d (seed) --s (steps) --l (guidance) --n\n"
                                     + "\n".join(DEMO_PROMPTS) + "\n", encoding="utf-8")
    raw = demo_spec_dict(out, str(model_dir), steps)
    (out / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    spec = load_spec(raw=raw)
    run = RunDir.create(out / "runs", "zxq-demo")
    run.write_spec(spec)
    log(f"run folder: {run.root}")
    trained = train_diffusion(spec, run, log=log, show_progress=show_progress)
    first = (trained.result.first_eval or {}).get("fixed_noise_loss")
    last = (trained.result.last_eval or {}).get("fixed_noise_loss")
    (out / "result.json").write_text(json.dumps({"fixed_noise_loss": [first, last], "run": str(run.root)}), encoding="utf-8")
    return ImageDemoResult(out, run.root, first, last, sorted(run.samples.glob("*.png")),
                           run.adapter / "pytorch_lora_weights.safetensors", run.adapter / "zxq-demo.safetensors",
                           trained.cache_hits, trained.cache_misses)
