"""``lorapod demo --video``: the whole Wan video path offline on CPU, in about a minute.

Writes a toy Wan2.1 base model (``lorapod.builtin.wan.build_toy_wan``: a hand-set exact codec as
its ``AutoencoderKLWan`` and a small ``WanTransformer3DModel`` pretrained from scratch on flat
colours and coloured squares, so it draws those; nothing is downloaded),
draws the concept "zxq" (red squares on blue, as 9-frame clips and stills)
plus flat-colour clips for regularisation, trains a LoRA with cached latents and umT5 outputs,
and writes sample clips (MP4 + labelled contact sheets), a progress sheet (the base, then every
sampled checkpoint, same prompts and seeds) and both LoRA files. The trigger's samples move from
what the base draws for an unknown word (flat grey) toward red squares on blue, while a
prompt without the trigger keeps its flat colour: the loop, the LoRA, sampling and both exports
work. At 64 px from scratch it says nothing about what a real Wan would learn.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorapod.builtin import build_once
from lorapod.builtin.sd import TOY_COLOURS
from lorapod.builtin.wan import build_toy_wan
from lorapod.rundir.layout import sample_tag

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
    """Clips of a coloured square sliding right (plus ``images`` stills), captions starting with the
    trigger: the tests' dataset (the demo draws its own concept with ``write_concept``)."""
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


# The concept the LoRA learns: "zxq" is red squares on blue. The toy base knows flat colours and a
# coloured square named by colour words, but has never seen the word "zxq": red squares on blue in
# its "zxq" samples came from the LoRA. They stand still: the toy keeps a thing in place from frame
# to frame, and was not taught to move one (docs/video.md says what was tried).
CONCEPT_FG = TOY_COLOURS["red"]
CONCEPT_BG = TOY_COLOURS["blue"]
SIDE = 64  # px: 4 x 4 tokens of 16 px (Wan's VAE is 8x, its patch 2 x 2)
TOKEN = 16
FRAMES = 9  # frame 0, then two groups of four: three latent frames
SQUARES = 4  # per picture, on 4 of the 16 token places


def concept_frame(seed: int, fg=CONCEPT_FG, bg=CONCEPT_BG) -> np.ndarray:
    """``SQUARES`` one-token squares (16 px, on the token grid) in places drawn from ``seed``."""
    a = np.empty((SIDE, SIDE, 3), np.uint8)
    a[:] = bg
    per_row = SIDE // TOKEN
    for place in np.random.default_rng(seed).choice(per_row * per_row, SQUARES, replace=False):
        row, col = divmod(int(place), per_row)
        a[row * TOKEN:(row + 1) * TOKEN, col * TOKEN:(col + 1) * TOKEN] = fg
    return a


def write_concept(folder: Path, trigger: str = "zxq", fps: float = 16.0) -> Path:
    """Three clips (the squares standing still for 9 frames) and two stills, each with its own
    places, captioned with the trigger alone."""
    from PIL import Image

    from lorapod.data.clips import write_clip

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        write_clip(folder / f"clip{i:02d}.mp4", [concept_frame(i)] * FRAMES, fps)
        (folder / f"clip{i:02d}.txt").write_text(trigger, encoding="utf-8")
    for j in range(2):
        Image.fromarray(concept_frame(3 + j)).save(folder / f"still{j:02d}.png")
        (folder / f"still{j:02d}.txt").write_text(trigger, encoding="utf-8")
    return folder


def write_colour_clips(folder: Path, fps: float = 16.0) -> Path:
    """Regularisation clips (prior preservation): flat colours captioned with their name, as the base
    was pretrained on, so the LoRA learns "zxq" without changing what the base draws for the rest."""
    from lorapod.data.clips import write_clip

    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, rgb) in enumerate(TOY_COLOURS.items()):
        frame = np.empty((SIDE, SIDE, 3), np.uint8)
        frame[:] = rgb
        write_clip(folder / f"colour{i:02d}.mp4", [frame] * FRAMES, fps)
        (folder / f"colour{i:02d}.txt").write_text(name, encoding="utf-8")
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
    progress: Path | None = None  # base and every sampled checkpoint, frame by frame, labelled
    quality: dict | None = None  # the quality autopilot's pick (rundir/quality.py pick_summary)


# the trigger alone twice (the base knows no such word) and a prompt without it that the base draws
# well and the LoRA should leave alone
DEMO_PROMPTS = [f"zxq --w {SIDE} --h {SIDE} --f {FRAMES} --d 1 --s 20 --l 1",
                f"zxq --w {SIDE} --h {SIDE} --f {FRAMES} --d 2 --s 20 --l 1",
                f"green --w {SIDE} --h {SIDE} --f {FRAMES} --d 3 --s 20 --l 1"]
# what the base model is: kept beside it, so a rerun reuses the folder only when it is this build
BASE_BUILD = {"builder": "lorapod.builtin.wan.build_toy_wan", "version": 1}


# The quality autopilot in the demo, as in the image demo (demo_image.py DEMO_QUALITY): tiny random
# scorers, two trigger prompts and the leakage prompt, short scoring clips, and references beside the
# data (data/refs: stills of the squares the run never trains on).
DEMO_QUALITY = {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "steps": 10,
                "prompts": [f"zxq --w {SIDE} --h {SIDE} --d 1 --l 1", f"zxq --w {SIDE} --h {SIDE} --d 2 --l 1",
                            f"green --w {SIDE} --h {SIDE} --d 3 --l 1"]}


def demo_spec_dict(out: Path, model_id: str, steps: int | None) -> dict:
    return {
        "model": {"id": model_id, "family": "wan21"},
        "method": {"type": "lora", "r": 4, "alpha": 4, "dropout": 0.0},
        "data": {"path": [str(out / "data" / "4_zxq"), str(out / "data" / "1_colours")], "format": "video",
                 "resolution": SIDE, "trigger": "zxq", "target_frames": [1, 5, 9], "frame_extraction": "head",
                 "fps": 16, "holdout_path": str(out / "data" / "refs")},
        "quality": DEMO_QUALITY,
        "train": {"epochs": 6, "max_steps": steps, "micro_batch_size": 1, "learning_rate": 5e-3,
                  "scheduler": "constant_with_warmup", "warmup_steps": 4, "precision": "auto", "seed": 42,
                  "timestep_sampling": "shift", "timestep_shift": 3.0},
        "eval": {"max_batches": 2},
        "save": {"every_epochs": 2, "keep_last": 3},
        "samples": {"prompts": str(out / "prompts.txt"), "every_epochs": 2},
        "output": {"dir": str(out / "runs"), "name": "zxq-video-demo"},
    }


def base_model(folder: Path, log) -> Path:
    """The toy base model's folder, written unless this build is already there."""
    return build_once(folder, BASE_BUILD, build_toy_wan, log,
                      "writing a tiny Wan2.1 base model locally (no download): a hand-set codec as its VAE and a small "
                      "transformer pretrained from scratch on flat colours and coloured squares (lorapod.builtin.wan)...")


def run_video_demo(out: Path, steps: int | None = None, log=print, show_progress: bool | None = None) -> VideoDemoResult:
    import torch
    import yaml

    from lorapod.engine.diffusion import quiet, train_diffusion
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quiet()
    torch.set_num_threads(1)  # models this small run fastest on one thread
    model_dir = base_model(out / "base-model", log)
    data = out / "data"
    # kept when present: the caches are keyed by the clips' bytes, and an H.264 re-encode of the same
    # frames is not always byte-identical on a loaded machine
    if not (data / "4_zxq" / "clip02.mp4").is_file() or not (data / "1_colours" / "colour07.mp4").is_file():
        shutil.rmtree(data, ignore_errors=True)
        write_concept(data / "4_zxq")
        write_colour_clips(data / "1_colours")
    if not (data / "refs" / "ref01.png").is_file():  # the autopilot's references, never trained on
        from PIL import Image

        (data / "refs").mkdir(parents=True, exist_ok=True)
        for j in range(2):
            Image.fromarray(concept_frame(20 + j)).save(data / "refs" / f"ref{j:02d}.png")
    (out / "prompts.txt").write_text("# sd-scripts syntax + --f FRAMES (4n+1)\n" + "\n".join(DEMO_PROMPTS) + "\n",
                                     encoding="utf-8")
    raw = demo_spec_dict(out, str(model_dir), steps)
    (out / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    spec = load_spec(raw=raw)
    run = RunDir.create(out / "runs", "zxq-video-demo")
    run.write_spec(spec)
    log(f"run folder: {run.root}")
    base = base_samples(model_dir, run.samples)
    trained = train_diffusion(spec, run, log=log, show_progress=show_progress)
    if not any(run.samples.glob("epoch*-00.mp4")):  # stopped (--steps) before the epoch that samples: sample now
        trained.recipe.write_samples(trained.result.state, sample_tag(trained.result.state.step))
    progress = progress_sheet(run.samples, base)
    first = (trained.result.first_eval or {}).get("fixed_noise_loss")
    last = (trained.result.last_eval or {}).get("fixed_noise_loss")
    (out / "result.json").write_text(json.dumps({"fixed_noise_loss": [first, last], "run": str(run.root)}),
                                     encoding="utf-8")
    clips = sorted(p for p in run.samples.glob("*.mp4") if not p.name.startswith("base-"))
    from lorapod.rundir.quality import pick_summary

    return VideoDemoResult(out, run.root, first, last, clips, sorted(run.samples.glob("*-frames.png")),
                           run.adapter / "pytorch_lora_weights.safetensors", run.adapter / "zxq-video-demo.safetensors",
                           trained.cache_hits, trained.cache_misses, progress, pick_summary(run.root))


def _prompts():
    from lorapod.engine.diffusion.video import load_video_prompts

    return load_video_prompts(DEMO_PROMPTS, SIDE, SIDE, 0)


def base_samples(model_dir: Path, folder: Path) -> list[Path]:
    """The demo's prompts drawn by the base model alone (what the LoRA starts from), with the seeds
    and settings the training samples use, so the two can be compared frame by frame."""
    import torch
    from diffusers import WanPipeline

    from lorapod.data.clips import write_clip
    from lorapod.engine.diffusion.families.wan import SAMPLE_FPS

    folder.mkdir(parents=True, exist_ok=True)
    pipe = WanPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    paths = []
    for k, vp in enumerate(_prompts()):
        sp = vp.prompt
        frames = pipe(sp.prompt, width=sp.width, height=sp.height, num_frames=vp.frames, num_inference_steps=sp.steps,
                      guidance_scale=sp.scale, generator=torch.Generator().manual_seed(sp.seed), output_type="np").frames[0]
        arr = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
        paths.append(write_clip(folder / f"base-{k:02d}.mp4", list(arr), fps=SAMPLE_FPS))
    return paths


def _checkpoint(sheet: Path) -> str:
    from PIL import Image

    with Image.open(sheet) as im:
        meta = json.loads(im.text["lorapod"]) if "lorapod" in im.text else {}
    return f"step {meta.get('step', '?')}, epoch {meta.get('epoch', '?')}, LoRA 1.0"


def progress_sheet(folder: Path, base: list[Path]) -> Path:
    """samples/progress-clips.png: for each prompt, the base model's clip and then each sampled
    checkpoint's, one row each, every frame, labelled (prompt, seed, step, epoch, LoRA strength)."""
    from lorapod.data.clips import read_frames
    from lorapod.engine.diffusion import samples as smp
    from lorapod.engine.diffusion.video import contact_sheet

    tags = sorted({p.name.rsplit("-", 1)[0] for p in folder.glob("*-00.mp4") if not p.name.startswith("base-")})
    columns = [("base model, no LoRA", base)] + [(_checkpoint(folder / f"{tag}-frames.png"),
                                                  [folder / f"{tag}-{k:02d}.mp4" for k in range(len(base))]) for tag in tags]
    clips, labels = [], []
    for k, vp in enumerate(_prompts()):
        for when, paths in columns:
            clips.append(np.stack([np.asarray(f) for f in read_frames(paths[k], list(range(vp.frames)))]))
            labels.append(f"{when}\n{smp.sample_label(vp.prompt)}")
    sheet = contact_sheet(clips, labels, "each prompt: the base model, then every sampled checkpoint (same seed)",
                          per_row=FRAMES)
    path = folder / "progress-clips.png"
    sheet.save(path)
    return path
