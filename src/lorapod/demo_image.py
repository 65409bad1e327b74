"""``lorapod demo --image``: the whole image path offline on CPU, in about a minute.

Builds a tiny Stable-Diffusion-style pipeline from configs (random weights, a CLIP tokenizer
written in code: nothing is downloaded), draws a small dataset of a coloured shape with a
trigger word, trains a LoRA with cached latents and text-encoder outputs, writes samples and
both LoRA formats. The images a random tiny model draws are noise; what the demo shows is the
machinery: caching, buckets, loss going down, samples with metadata, ComfyUI-ready files.
The test suite builds its tiny pipelines with the same functions.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

WORDS = ["a", "photo", "of", "zxq", "mug", "red", "blue", "square", "circle", "on", "table", "in", "the",
         "park", "green", "background", "style", "drawing", "cat", "dog"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the CLIP/BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def clip_tokenizer(out: Path):
    """A CLIPTokenizer whose vocabulary is the byte alphabet plus a few whole words."""
    from transformers import CLIPTokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    for ch in bytes_to_unicode().values():
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    merges: list[str] = []
    for w in WORDS:
        # merge left to right into the whole word (with its end-of-word marker)
        pieces = [*w[:-1], w[-1] + "</w>"]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            merges.append(f"{a} {b}")
            vocab.setdefault(a + b, len(vocab))
            pieces = [a + b, *pieces[2:]]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = list(dict.fromkeys(merges))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    tok = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"), model_max_length=16)
    return tok


def clip_text_model(vocab_size: int, projection: bool, hidden: int = 32, seed: int = 0):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, projection_dim=hidden,
                         bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def tiny_vae(seed: int = 0, latent_channels: int = 4, **kw):
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(block_out_channels=(8, 16, 16), in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 3, layers_per_block=1,
                         up_block_types=("UpDecoderBlock2D",) * 3, norm_num_groups=8,
                         sample_size=32, **kw)


def build_sd15(out: Path, prediction_type: str = "epsilon", seed: int = 0) -> Path:
    """A tiny StableDiffusionPipeline folder (latents are 1/4 of the image: the VAE has three blocks)."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    tok = clip_tokenizer(out / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8, attention_head_dim=8)
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, prediction_type=prediction_type, steps_offset=1)
    pipe = StableDiffusionPipeline(unet=unet, vae=tiny_vae(seed), text_encoder=clip_text_model(len(tok), False, seed=seed),
                                   tokenizer=tok, scheduler=sched, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(out)
    return out


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
