"""Image LoRA throughput: lorapod (cached latents + text-encoder outputs) vs a plain diffusers +
peft loop that encodes every batch, on the same small SD-style model, in one run.

    PYTHONPATH=src python bench/image_throughput.py [--images 16] [--resolution 128] [--steps 24]

Prints a markdown table: steps/s of each, the one-off caching cost, and what caching saves over
an 8-epoch job (the sd-scripts recipe's length). The model is random but shaped like a small SD
pipeline (two-level UNet with cross-attention, three-level VAE, CLIP text encoder), so the
ratio of encoder cost to UNet cost, not the absolute speed, is what carries over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def build(root: Path, seed: int = 0) -> Path:
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    from lorapod.builtin.sd import clip_text_model, clip_tokenizer

    tok = clip_tokenizer(root / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(64, 128), layers_per_block=2, sample_size=32, in_channels=4,
                                out_channels=4, down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64,
                                norm_num_groups=16, attention_head_dim=16)
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    # the VAE keeps SD's shape (3 down levels, 2 resnets each) at about 1/4 of its width, so the
    # encoder's share of a step is in the range of a real SD/SDXL step, not negligible
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    vae = AutoencoderKL(block_out_channels=(32, 64, 128, 128), layers_per_block=2, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        norm_num_groups=16, sample_size=128)
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=clip_text_model(len(tok), False, hidden=64, seed=seed),
                                   tokenizer=tok, scheduler=sched, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(root / "model")
    return root / "model"


def spec_raw(model: Path, data: Path, out: Path, resolution: int, steps: int) -> dict:
    return {
        "model": {"id": str(model), "family": "sd15"},
        "method": {"r": 16, "alpha": 16, "dropout": 0.0},
        "data": {"path": str(data), "format": "images", "resolution": resolution, "buckets": False},
        "train": {"max_steps": steps, "epochs": 100, "micro_batch_size": 2, "learning_rate": 1e-4,
                  "scheduler": "constant", "precision": "fp32", "seed": 0},
        "eval": {"at_start": False, "max_batches": 1},
        "save": {"every_epochs": None, "keep_last": 1},
        "output": {"dir": str(out), "name": "bench"},
    }


def lorapod_run(model: Path, data: Path, root: Path, resolution: int, steps: int) -> tuple[float, float]:
    """(steps/s in the loop, seconds spent preparing the caches on a cold cache)."""
    from lorapod.engine.diffusion import train_diffusion
    from lorapod.engine.metrics import read_metrics
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    spec = load_spec(raw=spec_raw(model, data, root / "runs", resolution, steps))
    run = RunDir.create(spec.output.dir, "bench")
    t0 = time.perf_counter()
    marks: dict[str, float] = {}

    def log(m: str) -> None:
        if m.startswith("model "):  # printed once caches are built and LoRA attached
            marks["ready"] = time.perf_counter()

    train_diffusion(spec, run, device="cpu", show_progress=False, log=log, cache_root=root / "cache")
    times = [r["step_time_s"] for r in read_metrics(run.metrics_file) if "step_time_s" in r][2:]
    return 1 / statistics.median(times), marks["ready"] - t0


def plain_run(model: Path, data: Path, resolution: int, steps: int) -> tuple[float, float]:
    """diffusers + peft as their example scripts do without caching: encode every batch.
    Returns (steps/s, share of a step spent loading + encoding)."""
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, StableDiffusionPipeline
    from peft import LoraConfig
    from PIL import Image

    pipe = StableDiffusionPipeline.from_pretrained(str(model))
    unet, vae, te, tok = pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer
    for m in (unet, vae, te):
        m.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=16, lora_alpha=16, init_lora_weights="gaussian",
                                target_modules=["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out",
                                                "ff.net.0.proj", "ff.net.2"]))
    params = [p for p in unet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    noise_sched = DDPMScheduler.from_config(pipe.scheduler.config)
    files = sorted(data.glob("*.png"))
    times, enc = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        batch = [files[(2 * step + k) % len(files)] for k in range(2)]
        px = torch.stack([
            torch.from_numpy(__import__("numpy").asarray(Image.open(f).convert("RGB").resize((resolution, resolution)),
                                                          dtype="float32") / 127.5 - 1).permute(2, 0, 1)
            for f in batch])
        caps = [f.with_suffix(".txt").read_text() for f in batch]
        with torch.no_grad():
            lat = vae.encode(px).latent_dist.sample() * vae.config.scaling_factor
            ids = tok(caps, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt").input_ids
            emb = te(ids)[0]
        enc.append(time.perf_counter() - t0)
        noise = torch.randn_like(lat)
        t = torch.randint(0, 1000, (lat.shape[0],))
        pred = unet(noise_sched.add_noise(lat, noise, t), t, encoder_hidden_states=emb).sample
        F.mse_loss(pred, noise).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return 1 / statistics.median(times[2:]), statistics.median(enc[2:]) / statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--resolution", type=int, default=128)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from lorapod.demo_image import write_images
    from lorapod.engine.diffusion import quiet

    quiet()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build(root)
        sizes = [(args.resolution + 32, args.resolution + 32)]
        data = write_images(root / "data", n=args.images, sizes=sizes)
        ours, prep = lorapod_run(model, data, root, args.resolution, args.steps)
        plain, share = plain_run(model, data, args.resolution, args.steps)

    steps_per_epoch = args.images // 2
    n = 8 * steps_per_epoch
    t_ours = prep + n / ours
    t_plain = n / plain
    print(f"Image LoRA throughput, CPU ({args.threads} thread(s)), SD-style model, {args.resolution} px, batch 2, "
          f"rank 16, {args.images} images\n")
    print("| loop | steps/s | one-off caching (s) | 8-epoch job (s) |")
    print("|---|---:|---:|---:|")
    print(f"| lorapod (cached latents + text-encoder outputs) | {ours:.2f} | {prep:.1f} | {t_ours:.1f} |")
    print(f"| diffusers + peft, encoding every batch | {plain:.2f} | 0 | {t_plain:.1f} |")
    print(f"\nloading + encoding (VAE, text encoder) is {100 * share:.0f}% of an uncached step here.")
    print(f"lorapod: {ours / plain:.2f}x the steps/s; over 8 epochs ({n} steps) caching saves "
          f"{t_plain - t_ours:.1f} s ({100 * (t_plain - t_ours) / t_plain:.0f}%), caching cost included.")


if __name__ == "__main__":
    main()
