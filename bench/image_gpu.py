"""SDXL LoRA step speed and peak VRAM on a GPU, beside the planner's prediction for the same job
on the same card (and the published 1.1-1.4 it/s: sd-scripts, RTX 4090, 1024 px, batch 1, cached
latents and text-encoder outputs).

    PYTHONPATH=src python bench/image_gpu.py                 # CUDA: full-size SDXL UNet, 1024 px
    PYTHONPATH=src python bench/image_gpu.py --smoke         # CPU, seconds: checks the script (CI)

The planner's columns: its it/s for ``lorapod`` on this GPU (``plan.estimate.step_speed``; with
``--smoke``, or a GPU the catalog does not know, for ``--gpu``) and its peak read as
``torch.cuda.max_memory_allocated`` reads it (``Estimate.read_as("allocated")``: no CUDA context,
no allocator slack), next to the measured median it/s (after 3 warm-up steps) and allocated peak
(reset after the model is built, so it is the training steps' own).

The UNet is built from SDXL base 1.0's published config with random weights (nothing is
downloaded; speed and memory do not depend on the weight values). Each step is what lorapod's
loop does with cached latents and text-encoder outputs: noise, min-SNR-weighted epsilon loss,
backward through the LoRA (rank 16, lorapod's SDXL default targets), optimizer step, in bf16
autocast with gradient checkpointing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SDXL_UNET = dict(
    addition_embed_type="text_time", addition_embed_type_num_heads=64, addition_time_embed_dim=256,
    attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], cross_attention_dim=2048,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], in_channels=4, out_channels=4,
    layers_per_block=2, norm_num_groups=32, projection_class_embeddings_input_dim=2816, sample_size=128,
    transformer_layers_per_block=[1, 2, 10], use_linear_projection=True,
)
TINY_UNET = dict(SDXL_UNET, attention_head_dim=[2, 4, 4], block_out_channels=[32, 64, 64], cross_attention_dim=64,
                 addition_time_embed_dim=8, projection_class_embeddings_input_dim=80, norm_num_groups=8,
                 transformer_layers_per_block=[1, 1, 1], addition_embed_type_num_heads=8)


def planned(res: int, optimizer: str, fp8: bool, gpu_name: str) -> dict:
    """The planner's it/s (with its likely range) and peak for this bench's job on ``gpu_name``."""
    from lorapod.catalog.gpus import find_gpu, gpu_from_device_name
    from lorapod.catalog.models import find_model
    from lorapod.plan.estimate import step_speed
    from lorapod.plan.vram import Settings, estimate

    gpu = gpu_from_device_name(gpu_name) or find_gpu(gpu_name)
    model = find_model("sdxl")
    s = Settings(base_dtype="fp8" if fp8 else "bf16", r=16, targets="all-linear", optimizer=optimizer,
                 gradient_checkpointing=True, batch=1, resolution=res, framework="lorapod")
    est = estimate(model, s)
    speed = step_speed(model, s, gpu, est, learn=False)
    return {"gpu": gpu.name, "it_s": speed.it_per_s, "it_s_low": 1 / speed.high, "it_s_high": 1 / speed.low,
            "peak_allocated_gib": est.read_as("allocated"), "peak_device_gib": est.peak_gb}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", "--tiny", action="store_true", dest="smoke",
                    help="a small UNet of the same shape, on CPU, 32 px, 3 steps (checks the script)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 30; 3 with --smoke)")
    ap.add_argument("--resolution", type=int, default=1024)
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "adamw_8bit"])
    ap.add_argument("--fp8", action="store_true", help="store the transformer blocks' linear weights in float8")
    ap.add_argument("--gpu", default="H200", help="the planner's GPU when this one is not a catalog GPU (or --smoke)")
    args = ap.parse_args(argv)
    steps = args.steps or (3 if args.smoke else 30)

    from diffusers import DDPMScheduler, UNet2DConditionModel

    from lorapod.engine.device import resolve_precision
    from lorapod.engine.diffusion import attach_lora, lora_config, quiet, store_fp8
    from lorapod.engine.diffusion.families import SDXL
    from lorapod.engine.diffusion.recipe import min_snr_weights
    from lorapod.engine.optim import build_optimizer
    from lorapod.spec import load_spec

    quiet()
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        sys.exit("no CUDA GPU here: run with --smoke to check the script on CPU")
    device = torch.device("cuda" if cuda else "cpu")
    precision = resolve_precision("bf16" if cuda else "fp32", "auto", device)
    res = 32 if args.smoke else args.resolution
    if args.smoke:
        torch.set_num_threads(1)  # a tiny model: more threads only contend on a shared CI machine
    spec = load_spec(raw={"model": {"id": "x", "family": "sdxl"}, "data": {"path": "x"},
                          "method": {"r": 16, "alpha": 8, "dropout": 0.0},
                          "train": {"optimizer": args.optimizer, "learning_rate": 1e-4, "min_snr_gamma": 5.0}})
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**(TINY_UNET if args.smoke else SDXL_UNET)).to(device, precision.weights)
    unet.requires_grad_(False)
    if args.fp8:
        store_fp8(unet)
    attach_lora(unet, lora_config(spec, SDXL.default_targets))
    unet.enable_gradient_checkpointing()
    unet.train()
    params = [p for p in unet.parameters() if p.requires_grad]
    opt = build_optimizer(params, spec.train, device)
    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    lat = res // 8
    ctx_dim = unet.config.cross_attention_dim
    pooled_dim = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim

    class C:  # the minimal Components the family's forward reads
        denoiser = unet

    times = []
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        t0 = time.perf_counter()
        x0 = torch.randn(1, 4, lat, lat, device=device)
        noise = torch.randn_like(x0)
        t = torch.randint(0, 1000, (1,), device=device)
        cond = {"prompt_embeds": torch.randn(1, 77, ctx_dim, device=device),
                "pooled": torch.randn(1, pooled_dim, device=device)}
        meta = {"time_ids": torch.tensor([[res, res, 0, 0, res, res]], dtype=torch.float32)}
        with precision.autocast():
            noisy = sched.add_noise(x0, noise, t.cpu()).to(device, precision.weights)
            pred = SDXL().forward(C, noisy, t, cond, meta)
            w = min_snr_weights(sched.alphas_cumprod.to(device), t, 5.0, "epsilon")
            loss = ((pred.float() - noise) ** 2).mean(dim=(1, 2, 3)) * w
        loss.sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times[3:]) if len(times) > 4 else statistics.median(times)
    name = torch.cuda.get_device_name(device) if cuda else "CPU (tiny UNet, script check only)"
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    plan = planned(args.resolution, args.optimizer, args.fp8, name if cuda else args.gpu)
    row = {"device": name, "resolution": res, "optimizer": args.optimizer, "fp8": args.fp8, "it_s": 1 / steady,
           "peak_allocated_gib": peak, "planner": plan}
    print("| device | model | resolution | optimizer | fp8 | it/s | planner it/s (range) | peak allocated "
          "| planner peak allocated (device) |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    print(f"| {name} | SDXL UNet{' (tiny)' if args.smoke else ''}, LoRA r16 | {res} | {args.optimizer} | "
          f"{'yes' if args.fp8 else 'no'} | {1 / steady:.2f} | {plan['it_s']:.2f} ({plan['it_s_low']:.2f}-"
          f"{plan['it_s_high']:.2f}) on {plan['gpu']} at {args.resolution} px | "
          f"{'-' if peak is None else f'{peak:.1f} GiB'} | {plan['peak_allocated_gib']:.1f} GiB "
          f"({plan['peak_device_gib']:.1f}) |")
    print("\npublished (sd-scripts, RTX 4090, 1024 px, batch 1): 1.1-1.4 it/s")
    return row


if __name__ == "__main__":
    main()
