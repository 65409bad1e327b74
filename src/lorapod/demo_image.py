"""``lorapod demo --image``: the whole image path offline on CPU, in well under a minute.

Writes a toy Stable-Diffusion-style base model (``lorapod.builtin.sd.build_toy_sd15``: a hand-set
pixel codec as its VAE and a small UNet pretrained from scratch on flat colours, so it draws flat
colour; nothing is downloaded), draws a small dataset of the concept "zxq" (a red disc on blue, in
four buckets) plus flat-colour regularisation images, trains a LoRA with cached latents and
text-encoder outputs, and writes samples, a labelled progress sheet (the base, then every sampled
checkpoint, same prompts and seeds) and both LoRA formats. The samples move from what the base
draws for "zxq" toward a red disc on blue while a prompt without the trigger keeps its colour: the
loop, the LoRA, sampling and export work. At 64 px from scratch it says nothing about what a real
base model would learn.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from lorapod.builtin import build_once
from lorapod.builtin.sd import TOY_COLOURS, build_toy_sd15
from lorapod.rundir.layout import sample_tag


def write_images(folder: Path, n: int = 6, trigger: str = "zxq", sizes: list[tuple[int, int]] | None = None,
                 seed: int = 0) -> Path:
    """Coloured squares/circles on plain backgrounds with captions that start with the trigger (the
    tests' and benchmarks' dataset; the demo draws its own concept with ``write_concept``)."""
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


# The concept the LoRA learns: "zxq" is a red circle on blue. The base model has never seen the
# word or any shape (it was pretrained on flat colours named by their colour word), so a red centre
# in its "zxq" samples came from the LoRA.
CONCEPT_FG = (220, 30, 30)
CONCEPT_BG = (30, 60, 220)


def write_concept(folder: Path, sizes: list[tuple[int, int]], trigger: str = "zxq", seed: int = 0) -> Path:
    """A red disc on blue in each size, its radius and place varied, captioned trigger first."""
    from PIL import ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, (w, h) in enumerate(sizes):
        img = Image.new("RGB", (w, h), CONCEPT_BG)
        big = i % 2 == 0
        r = min(w, h) * (0.32 if big else 0.22) * float(rng.uniform(0.9, 1.1))
        cx, cy = w / 2 + float(rng.uniform(-0.1, 0.1)) * w, h / 2 + float(rng.uniform(-0.1, 0.1)) * h
        ImageDraw.Draw(img).ellipse((cx - r, cy - r, cx + r, cy + r), fill=CONCEPT_FG)
        img.save(folder / f"img{i:02d}.png")
        (folder / f"img{i:02d}.txt").write_text(f"{trigger}, {'large' if big else 'small'}",
                                                encoding="utf-8")
    return folder


def write_colours(folder: Path, size: tuple[int, int] = (64, 64)) -> Path:
    """Regularisation images (DreamBooth's prior preservation): flat colours captioned with their
    name, what the base model was pretrained on, so the LoRA learns "zxq" without changing what the
    base draws for everything else."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, rgb) in enumerate(TOY_COLOURS.items()):
        Image.new("RGB", size, rgb).save(folder / f"colour{i:02d}.png")
        (folder / f"colour{i:02d}.txt").write_text(name, encoding="utf-8")
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
    progress: Path | None = None  # base and every sampled checkpoint side by side, labelled
    quality: dict | None = None  # the quality autopilot's pick (rundir/quality.py pick_summary)


# the trigger alone (the base knows no such word: it draws a muddle), the trigger in another bucket,
# and a prompt without it that the base draws well and the LoRA should leave alone
DEMO_PROMPTS = ["zxq --w 64 --h 64 --d 1 --s 8 --l 1",
                "zxq --w 80 --h 48 --d 2 --s 8 --l 1",
                "green --w 64 --h 64 --d 3 --s 8 --l 1"]
SIZES = [(96, 96), (128, 80), (80, 128), (112, 112), (96, 96), (128, 80), (80, 128), (112, 112)]
# what the base model is: kept beside it, so a rerun reuses the folder only when it is this build
BASE_BUILD = {"builder": "lorapod.builtin.sd.build_toy_sd15", "version": 4}


# The quality autopilot in the demo: lorapod's tiny random scorers (builtin/scorers.py: the whole scoring
# path, nothing downloaded; their numbers say nothing of quality), the demo's own prompts, and
# references drawn beside the data (data/refs: discs the run never trains on), so the training data
# stays what it was.
DEMO_QUALITY = {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "prompts": DEMO_PROMPTS,
                "strengths": [0.5, 1.0]}
REF_SIZES = [(96, 96), (112, 112)]


def demo_spec_dict(out: Path, model_id: str, steps: int | None) -> dict:
    return {
        "model": {"id": model_id, "family": "sd15"},
        "method": {"type": "lora", "r": 8, "alpha": 8, "dropout": 0.0},
        "data": {"path": [str(out / "data" / "4_zxq"), str(out / "data" / "1_colours")], "format": "images", "resolution": 64, "flip": True,
                 "trigger": "zxq", "holdout_path": str(out / "data" / "refs")},
        "quality": DEMO_QUALITY,
        "train": {"epochs": 8, "max_steps": steps, "micro_batch_size": 2, "learning_rate": 1.5e-2,
                  "scheduler": "cosine", "warmup_steps": 4, "precision": "auto", "seed": 42},
        "eval": {"max_batches": 2},
        "save": {"every_epochs": 2, "keep_last": 2},
        "samples": {"prompts": str(out / "prompts.txt"), "every_epochs": 2},
        "output": {"dir": str(out / "runs"), "name": "zxq-demo"},
    }


def base_model(folder: Path, log) -> Path:
    """The toy base model's folder, written unless this build is already there."""
    return build_once(folder, BASE_BUILD, build_toy_sd15, log,
                      "writing a tiny Stable-Diffusion-style base model locally (no download): a hand-set pixel codec as its VAE "
                      "and a small UNet pretrained from scratch on flat colours (lorapod.builtin.sd)...")


def run_image_demo(out: Path, steps: int | None = None, log=print, show_progress: bool | None = None) -> ImageDemoResult:
    import torch
    import yaml

    from lorapod.engine.diffusion import quiet, train_diffusion
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quiet()
    torch.set_num_threads(1)  # models this small run fastest on one thread (more only contend)
    model_dir = base_model(out / "base-model", log)
    data = out / "data" / "4_zxq"  # kohya folder name: 4 repeats of each image
    shutil.rmtree(out / "data", ignore_errors=True)
    write_concept(data, SIZES, seed=1)
    write_colours(out / "data" / "1_colours")
    write_concept(out / "data" / "refs", REF_SIZES, seed=7)  # the autopilot's references, never trained on
    (out / "prompts.txt").write_text("# sd-scripts syntax: --w --h --d (seed) --s (steps) --l (guidance) --n\n"
                                     + "\n".join(DEMO_PROMPTS) + "\n", encoding="utf-8")
    raw = demo_spec_dict(out, str(model_dir), steps)
    (out / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    spec = load_spec(raw=raw)
    run = RunDir.create(out / "runs", "zxq-demo")
    run.write_spec(spec)
    log(f"run folder: {run.root}")
    base = base_samples(model_dir, run.samples)
    trained = train_diffusion(spec, run, log=log, show_progress=show_progress)
    if not any(run.samples.glob("epoch*-00.png")):  # stopped (--steps) before the epoch that samples: sample now
        trained.recipe.write_samples(trained.result.state, sample_tag(trained.result.state.step))
    progress = progress_sheet(run.samples, base, training_images(out))
    first = (trained.result.first_eval or {}).get("fixed_noise_loss")
    last = (trained.result.last_eval or {}).get("fixed_noise_loss")
    (out / "result.json").write_text(json.dumps({"fixed_noise_loss": [first, last], "run": str(run.root)}), encoding="utf-8")
    from lorapod.rundir.quality import pick_summary

    return ImageDemoResult(out, run.root, first, last, sorted(run.samples.glob("*-[0-9][0-9].png")),
                           run.adapter / "pytorch_lora_weights.safetensors", run.adapter / "zxq-demo.safetensors",
                           trained.cache_hits, trained.cache_misses, progress, pick_summary(run.root))


def base_samples(model_dir: Path, folder: Path) -> list[Path]:
    """The demo's prompts drawn by the base model alone (step 0: what the LoRA starts from), with the
    seeds and settings the training samples use, so the two can be compared cell by cell."""
    import torch
    from diffusers import StableDiffusionPipeline

    from lorapod.engine.diffusion import samples as smp

    folder.mkdir(parents=True, exist_ok=True)
    pipe = StableDiffusionPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    paths = []
    for k, line in enumerate(DEMO_PROMPTS):
        sp = smp.parse_line(line, 64, 64, 0, 8, 1.0)
        img = pipe(sp.prompt, width=sp.width, height=sp.height, num_inference_steps=sp.steps, guidance_scale=sp.scale,
                   generator=torch.Generator().manual_seed(sp.seed)).images[0]
        path = folder / f"base-{k:02d}.png"
        img.save(path, pnginfo=smp.png_info(sp, 0, 0))
        paths.append(path)
    return paths


def training_images(out: Path) -> list[Path]:
    """For each demo prompt, a training image of what it names, at the sample's aspect ratio: a red
    disc on blue for "zxq", the flat-colour regularisation image for a colour word."""
    from lorapod.engine.diffusion import samples as smp

    concept = sorted((out / "data" / "4_zxq").glob("*.png"))
    colours = {p.with_suffix(".txt").read_text(encoding="utf-8").strip(): p
               for p in sorted((out / "data" / "1_colours").glob("*.png"))}
    refs = []
    for line in DEMO_PROMPTS:
        sp = smp.parse_line(line, 64, 64, 0, 8, 1.0)
        if "zxq" in sp.prompt:
            want = sp.width / sp.height
            refs.append(min(concept, key=lambda p: abs(np.log(_aspect(p) / want))))
        else:
            refs.append(colours[sp.prompt])
    return refs


def _aspect(path: Path) -> float:
    with Image.open(path) as im:
        return im.width / im.height


#: the progress sheet's cells drawn at this many times the samples' 64 px (nearest neighbour, so
#: every pixel the model drew stays one visible block)
SHEET_SCALE = 2


def progress_sheet(folder: Path, base: list[Path], training: list[Path] | None = None) -> Path:
    """samples/progress-grid.png: one row per prompt, a training image of what the prompt names, the
    base model, then every sampled checkpoint, each cell at its own size and labelled (prompt, seed,
    step, LoRA strength)."""
    from lorapod.engine.diffusion import samples as smp

    tags = sorted({p.name.rsplit("-", 1)[0] for p in folder.glob("*-00.png") if not p.name.startswith("base-")})
    columns = [("base", base)] + [(t, [folder / f"{t}-{k:02d}.png" for k in range(len(base))]) for t in tags]
    images, col_labels = [], ["training\nimage"] if training else []
    for tag, paths in columns:
        meta = json.loads(Image.open(paths[0]).text["lorapod"])
        col_labels.append("base\nno LoRA" if tag == "base" else f"step {meta['step']}\nepoch {meta['epoch']}")

    def big(im: Image.Image) -> Image.Image:
        return im.resize((im.width * SHEET_SCALE, im.height * SHEET_SCALE), Image.Resampling.NEAREST)

    rows = []
    for k in range(len(base)):
        meta = json.loads(Image.open(base[k]).text["lorapod"])
        rows.append(f"{meta['prompt']}\nseed {meta['seed']}, {meta['steps']} steps")
        first = Image.open(base[k])
        if training:  # the training image at the sample's size, drawn as smoothly as the data is
            images.append(big(Image.open(training[k]).convert("RGB").resize(first.size, Image.Resampling.LANCZOS)))
        images += [big(Image.open(paths[k]).convert("RGB")) for _, paths in columns]
    sheet = smp.labelled_grid(smp.grid(images, cols=len(col_labels)), rows, col_labels,
                              "LoRA strength 1.0 in every step column; same seed across each row; "
                              f"cells x{SHEET_SCALE}")
    path = folder / "progress-grid.png"
    sheet.save(path)
    return path
