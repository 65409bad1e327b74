"""lorapod's first contact with a GPU, in one run of at most 8 minutes on one card: every check the GPU
review (2026-12-02) and issue 33 ask for, the planner's prediction printed beside what is measured.

    PYTHONPATH=src python bench/gpu_check.py --out OUT_DIR            # on the GPU (budget 450 s)
    PYTHONPATH=src python bench/gpu_check.py --smoke --out /tmp/gc    # CPU, tiny shapes: checks the script (CI)
    PYTHONPATH=src python bench/gpu_check.py --out OUT_DIR --only sdxl,oom

``--out`` gets ``gpu_check.json`` only (the lent GPU machine returns at most 8 files and 64 MiB);
the checks' work files (a 1 GB model folder, run folders) go to ``--work``, a temporary folder by
default, removed at the end. docs/performance.md has the exact call for the lent GPU, with the
wheels ``tools/gpu_wheels.sh`` builds.

Models are built from their published configs with random weights (speed and memory do not depend
on the values; nothing is downloaded): Qwen2.5-0.5B for the LLM runs, Qwen2.5-0.5B- and 7B-shaped
attention, the SDXL base UNet at 1024 px, a FLUX.1-width DiT (3072 wide, 2 double + 4 single blocks),
the Wan2.1 1.3B transformer with block swap. Each check is its own try/except, so one failing does
not stop the rest, and ``OUT/gpu_check.json`` is rewritten after every check, so a run cut short
still reports what it did. A check whose estimated time would pass ``--budget`` is skipped (said so
in the JSON). Memory is GiB as ``torch.cuda.max_memory_allocated`` reads it, reset before each check;
the planner's peaks are read the same way (``Estimate.read_as("allocated")``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))
GiB = 1024**3


class Ctx:
    def __init__(self, smoke: bool, out: Path, budget: float, gpu: str, work: Path) -> None:
        self.smoke = smoke
        self.cuda = torch.cuda.is_available() and not smoke
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        self.out = out
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.peak_tflops: float | None = None  # the measured bf16 matmul peak (check_peak)
        self.lorapod_tokens_s: float | None = None  # llm_lora's seq2048 real tokens/s, for the TRL ratio
        self.deadline = time.time() + budget
        self.gpu = torch.cuda.get_device_name(0) if self.cuda else gpu  # the planner's card
        self.llm: Path | None = None

    def reset(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float | None:
        return round(torch.cuda.max_memory_allocated() / GiB, 3) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def _gpu(ctx: Ctx):
    from lorapod.catalog.gpus import find_gpu, gpu_from_device_name

    return gpu_from_device_name(ctx.gpu) or find_gpu(ctx.gpu)


def _planned(ctx: Ctx, model, settings) -> dict:
    """The planner's peak (read as max_memory_allocated) and seconds per micro-batch on this card."""
    try:
        from lorapod.plan.estimate import step_speed
        from lorapod.plan.vram import estimate

        est = estimate(model, settings)
        speed = step_speed(model, settings, _gpu(ctx), est, learn=False)
        return {"gpu": _gpu(ctx).name, "peak_allocated_gib": est.read_as("allocated"), "peak_device_gib": est.peak_gb,
                "s_per_micro_batch": round(speed.seconds_per_step, 4),
                "s_range": [round(speed.low, 4), round(speed.high, 4)]}
    except Exception as exc:  # the measurement stands without a prediction
        return {"error": f"{type(exc).__name__}: {exc}"}


def _timed(ctx: Ctx, fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    ctx.sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ctx.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------- checks


def check_env(ctx: Ctx) -> dict:
    """Versions, the GPU, the precision ``auto`` picks (G6), TF32 (G19), host-to-device GB/s (block swap)."""
    import importlib

    from lorapod.engine.attention import flash_available, varlen_available
    from lorapod.engine.device import bf16_native, resolve_precision, tf32_flags

    out: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": ctx.gpu if ctx.cuda else "cpu"}
    for name in ("transformers", "huggingface_hub", "peft", "accelerate", "diffusers", "trl", "bitsandbytes",
                 "pydantic", "triton"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as exc:
            out[name] = f"not importable ({type(exc).__name__})"
    out["varlen_attn"] = varlen_available()
    out["flash_attn"] = flash_available()
    p = resolve_precision("auto", "auto", ctx.dev)
    out["auto_precision"] = p.compute
    out["tf32_matmul_conv"] = list(tf32_flags())
    out["alloc_conf"] = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if ctx.cuda:
        out["capability"] = list(torch.cuda.get_device_capability(0))
        out["bf16_supported_default"] = torch.cuda.is_bf16_supported()
        out["bf16_native"] = bf16_native(ctx.dev)
        out["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GiB, 2)
        n = 256 * 2**20
        for kind, host in (("pinned", torch.empty(n, dtype=torch.uint8).pin_memory()),
                           ("pageable", torch.empty(n, dtype=torch.uint8))):
            sec = _timed(ctx, lambda h=host: h.to(ctx.dev, non_blocking=True), 1, 5)
            out[f"h2d_gb_s_{kind}"] = round(n / sec / 1e9, 1)
    return out


def check_attention(ctx: Ctx) -> dict:
    """SDPA causal forward + backward with Qwen2.5-0.5B (14 q / 2 kv heads of 64) and 7B (28 / 4 of 128)
    heads at 2k-8k tokens: ms, TFLOP/s, and whether the flash kernel takes it."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shapes = {"qwen2.5-0.5b": (14, 2, 64), "qwen2.5-7b": (28, 4, 128)}
    lengths = [64] if ctx.smoke else [2048, 4096, 8192]
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    rows = []
    for name, (h, kv, d) in shapes.items():
        for n in lengths:
            ctx.reset()
            q = torch.randn(1, h, n, d, device=ctx.dev, dtype=dtype, requires_grad=True)
            k = torch.randn(1, kv, n, d, device=ctx.dev, dtype=dtype, requires_grad=True)
            v = torch.randn(1, kv, n, d, device=ctx.dev, dtype=dtype, requires_grad=True)

            def step(q=q, k=k, v=v):
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

            sec = _timed(ctx, step, 1, 3)
            flops = 3.5 * 2 * 2 * h * d * n * n / 2  # fwd (QK^T, PV) + 2.5x in backward, causal half
            row = {"shape": name, "tokens": n, "ms": round(sec * 1e3, 2), "tflops": round(flops / sec / 1e12, 1),
                   "peak_gib": ctx.peak()}
            if ctx.cuda:
                try:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        step()
                    row["flash"] = "runs"
                except RuntimeError as exc:
                    row["flash"] = f"refused: {str(exc).splitlines()[0][:120]}"
            rows.append(row)
    return {"runs": rows}


def check_peak(ctx: Ctx) -> dict:
    """The card's measured bf16 matmul peak (8,192 x 8,192 x 8,192, TFLOP/s): the MFU columns'
    denominator, beside the catalog's datasheet figure."""
    n = 256 if ctx.smoke else 8192
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    a = torch.randn(n, n, device=ctx.dev, dtype=dtype)
    b = torch.randn(n, n, device=ctx.dev, dtype=dtype)
    sec = _timed(ctx, lambda: a @ b, 2, 5 if ctx.smoke else 20)
    ctx.peak_tflops = 2 * n**3 / sec / 1e12
    out = {"n": n, "dtype": str(dtype), "tflops": round(ctx.peak_tflops, 1)}
    with contextlib.suppress(Exception):
        out["catalog_bf16_tflops"] = _gpu(ctx).bf16_tflops
    return out


def check_packed_attention(ctx: Ctx) -> dict:
    """One Qwen2.5-0.5B attention layer (14 / 2 heads of 64) on 4 packed rows of chat-length examples,
    forward + backward, at two lengths: lorapod's padding-free path as the engine runs it here
    (varlen_attn on CUDA where torch has it, else one SDPA per example) beside torch's varlen_attn
    called directly (the ideal) and, on CUDA, one dense masked SDPA call; ms, and the ops counted."""
    import attention_ops

    rows = []
    for n in ((128, 256) if ctx.smoke else (2048, 4096)):
        batch = attention_ops.packed_rows(n, 4)
        dtype = torch.bfloat16 if ctx.cuda else torch.float32
        for path in ("split", "varlen_attn"):
            if path == "varlen_attn" and not (ctx.cuda and _has_varlen()):
                rows.append({"tokens": n, "path": path, "skipped": "needs CUDA and torch's varlen_attn"})
                continue
            runs = "varlen_attn" if path == "varlen_attn" else "lorapod"
            if runs == "varlen_attn":
                fn = functools.partial(attention_ops.run, "varlen_attn", batch, str(ctx.dev), dtype)
            else:  # what the engine runs on this device: its own choice
                fn = functools.partial(_lorapod_attention, batch, ctx, dtype)
            ctx.reset()
            sec = _timed(ctx, fn, 1, 3)
            rows.append({"tokens": n, "path": runs, "examples": sum(1 for p in batch.pad_seqs if not p),
                         "ms": round(sec * 1e3, 2), "peak_gib": ctx.peak()})
    return {"runs": rows}


def _has_varlen() -> bool:
    from lorapod.engine.attention import varlen_available

    return varlen_available()


def _lorapod_attention(batch, ctx: Ctx, dtype) -> None:
    from types import SimpleNamespace

    import attention_ops
    from lorapod.engine import attention

    B, L = batch.input_ids.shape
    q = torch.randn(B, attention_ops.HEADS, L, attention_ops.DIM, device=ctx.dev, dtype=dtype, requires_grad=True)
    k = torch.randn(B, attention_ops.KV, L, attention_ops.DIM, device=ctx.dev, dtype=dtype, requires_grad=True)
    moved = batch.to(ctx.dev)
    kw = attention.forward_kwargs(moved, attention.AttentionPath("sdpa", False, "gpu_check"), dtype)
    kw.pop("attention_mask")
    out, _ = attention.varlen_sdpa(SimpleNamespace(training=True, is_causal=True), q, k, k, None, **kw)
    out.float().sum().backward()


def check_flex(ctx: Ctx) -> dict:
    """flex_attention as transformers runs it for a model without sdpa (Gemma 2 on CUDA; review N7):
    compiled, on packed rows, forward + backward at two lengths; the first call at each length
    includes the compile (and the recompile that a second length brings), then the steady time.
    Gemma 2's head_dim 256 (8 query / 4 key-value heads). CPU (--smoke): eager forward only."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import attention_ops

    heads, kv, dim = (2, 1, 16) if ctx.smoke else (8, 4, 256)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    fn = torch.compile(flex_attention) if ctx.cuda else flex_attention
    rows = []
    for n in ((64, 72) if ctx.smoke else (2048, 2056)):
        batch = attention_ops.packed_rows(n, 1)
        doc = batch.segment_ids[0].to(ctx.dev)
        pos = batch.position_ids[0].to(ctx.dev)

        def mask(b, h, q, k, doc=doc, pos=pos):
            return (doc[q] == doc[k]) & (pos[q] >= pos[k])

        block = create_block_mask(mask, 1, None, n, n, device=str(ctx.dev))
        q = torch.randn(1, heads, n, dim, device=ctx.dev, dtype=dtype, requires_grad=ctx.cuda)
        k = torch.randn(1, kv, n, dim, device=ctx.dev, dtype=dtype, requires_grad=ctx.cuda)
        times = []
        for _ in range(3 if ctx.cuda else 1):
            t0 = time.perf_counter()
            o = fn(q, k, k, block_mask=block, enable_gqa=True)
            if ctx.cuda:
                o.float().sum().backward()
            ctx.sync()
            times.append(time.perf_counter() - t0)
        rows.append({"tokens": n, "first_call_s": round(times[0], 2),
                     "steady_ms": round(statistics.median(times[1:]) * 1e3, 2) if len(times) > 1 else None,
                     "compiled": ctx.cuda})
    return {"runs": rows, "note": "the first call at the second length includes dynamo's recompile"}


def check_trl_varlen(ctx: Ctx) -> dict:
    """The LLM standard: TRL's SFTTrainer, packed and padding-free (its collator's cu_seq_lens), on
    FlashAttention varlen (torch's varlen_attn, bench/llm_throughput.py ``torch_varlen``), the same
    model, data, LoRA and length as llm_lora's seq2048; tokens/s, MFU and lorapod's ratio to it at
    equal data. CPU (--smoke): TRL on sdpa, two steps (no varlen kernel there)."""
    import llm_throughput

    root = _llm_assets(ctx)
    attn = llm_throughput.TORCH_VARLEN if ctx.cuda and _has_varlen() else "sdpa"
    seq = 128 if ctx.smoke else 2048
    ctx.reset()
    res = llm_throughput.run_trl(root, ctx.work / "trl", seq, 2 if ctx.smoke else 10, ctx.cuda, 0, attn=attn)
    kept = res["step_times"][2:] if len(res["step_times"]) > 3 else res["step_times"]
    sec = statistics.median(kept)
    tokens_s = res["real_tokens"] / max(1, res["steps"]) / sec
    row = {"attention": attn, "steps": res["steps"], "s_per_step": round(sec, 4), "real_tokens_per_s": round(tokens_s),
           "peak_allocated_gib": ctx.peak()}
    if ctx.lorapod_tokens_s:
        row["lorapod_over_trl"] = round(ctx.lorapod_tokens_s / tokens_s, 2)
    return row


def _mfu(ctx: Ctx, model, tokens_s: float, mean_example: float) -> dict:
    """Model FLOPs utilisation: (6 N + attention) x real tokens/s over the measured bf16 peak. N is every
    parameter (the usual 6N: forward 2N, backward 4N; LoRA skips the base's weight gradients, so the
    work done is nearer 4N: MFU by 6N is the convention, not the work); attention per token, forward +
    backward, causal, over examples of ``mean_example`` tokens: 6 x layers x heads x head_dim x length."""
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 6 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * mean_example
    flops = (6 * n + attn) * tokens_s
    peak = ctx.peak_tflops
    out = {"model_tflops_6n_attn": round(flops / 1e12, 2), "peak_tflops": round(peak, 1) if peak else None}
    if peak:
        out["mfu"] = round(flops / 1e12 / peak, 3)
    return out


def _llm_assets(ctx: Ctx) -> Path:
    """A Qwen2.5-0.5B-shaped model folder (random weights, lorapod's BPE tokenizer) and chat data;
    with --smoke lorapod's tiny built-in model and data."""
    if ctx.llm is not None:
        return ctx.llm
    root = ctx.work / "llm"
    if not (root / "model" / "config.json").exists():
        if ctx.smoke:
            from lorapod import demo
            from lorapod.builtin import llm

            train, val = llm.build_dataset()
            built = llm.build_base_model(root / "base", llm.demo_texts(train, val), hidden=32, layers=1)
            (root / "model").parent.mkdir(parents=True, exist_ok=True)
            built.rename(root / "model")
            demo.write_jsonl(root / "train.jsonl", train)
            demo.write_jsonl(root / "val.jsonl", val)
        else:
            import llm_throughput

            llm_throughput.build_assets(root, 1500, shape="qwen2.5-0.5b", device="cuda")
    ctx.llm = root
    return root


def _llm_spec(ctx: Ctx, root: Path, name: str, **over):
    from lorapod.spec import load_spec

    train = {"max_steps": 2 if ctx.smoke else 8, "epochs": 50, "micro_batch_size": 2 if ctx.smoke else 4,
             "grad_accum": 2, "learning_rate": 2e-4, "seed": 0, "warmup_steps": 0}
    train.update(over.pop("train", {}))
    raw = {"model": {"id": str(root / "model"), "family": "llm"},
           "method": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear", **over.pop("method", {})},
           "data": {"path": str(root / "train.jsonl"), "val_path": str(root / "val.jsonl"),
                    "sequence_len": 128 if ctx.smoke else 2048, "packing": True, **over.pop("data", {})},
           "train": train,
           "eval": {"at_start": False, "every_steps": None, "max_batches": 1},
           "save": {"every_steps": None, "every_epochs": None, **over.pop("save", {})},
           "output": {"dir": str(ctx.work / "runs"), "name": name}}
    return load_spec(raw=raw)


def _train(ctx: Ctx, spec, name: str, **kw):
    from lorapod.engine.llm import train_llm
    from lorapod.rundir import RunDir

    run = RunDir.create(spec.output.dir, name)
    run.write_spec(spec)
    return train_llm(spec, run, device=str(ctx.dev), show_progress=False, log=lambda m: None, **kw), run


def _llm_row(ctx: Ctx, spec, out, run) -> dict:
    from lorapod.catalog.models import find_model
    from lorapod.engine.metrics import read_metrics
    from lorapod.plan.vram import Settings

    steps = [r for r in read_metrics(run.metrics_file) if "step_time_s" in r]
    kept = steps[2:] if len(steps) > 3 else steps  # the first steps set up cuBLAS and the allocator
    sec = statistics.median(r["step_time_s"] for r in kept)
    model = find_model(spec.model.id, "llm")
    trainable, total = (sum(p.numel() for p in out.recipe.model.parameters() if p.requires_grad),
                        sum(p.numel() for p in out.recipe.model.parameters()))
    tokens = statistics.median(r["tokens_per_s"] for r in kept)
    row = {"steps": out.result.state.step, "s_per_step": round(sec, 4),
           "s_per_micro_batch": round(sec / spec.train.grad_accum, 4), "tokens_per_s": round(tokens),
           "real_tokens_per_s": round(statistics.median(r["real_tokens_per_s"] for r in kept)),
           "peak_allocated_gib": max((r.get("mem_gb", 0.0) for r in steps), default=None) if ctx.cuda else None,
           "peak_reserved_gib": max((r.get("mem_reserved_gb", 0.0) for r in steps), default=None) if ctx.cuda else None,
           "loss_first_last": [round(steps[0]["loss"], 4), round(steps[-1]["loss"], 4)],
           "params": total, "trainable": trainable,
           # base weights get no gradient under LoRA: 2N forward + 2N input gradients per token
           "model_tflops": round(4 * total * tokens / 1e12, 2),
           "planner": _planned(ctx, model, Settings.from_spec(spec, model))}
    ex = out.recipe.train_examples
    mean_example = sum(len(e) ** 2 for e in ex) / max(1, sum(len(e) for e in ex))  # a token's mean causal context x 2
    row.update(_mfu(ctx, out.recipe.model.get_base_model(), row["real_tokens_per_s"], mean_example))
    row["attention"] = out.recipe.attention.describe(ctx.dev)
    return row


def check_llm_lora(ctx: Ctx) -> dict:
    """lorapod's LLM engine end to end: Qwen2.5-0.5B shape, LoRA r16 all-linear, 2048 tokens packed,
    4 x 2 micro-batches, 8 steps; then 4096 tokens with gradient checkpointing."""
    root = _llm_assets(ctx)
    rows = {}
    for name, over in (("seq2048", {}), ("seq4096_gc", {"data": {"sequence_len": 256 if ctx.smoke else 4096},
                                                        "train": {"micro_batch_size": 2,
                                                                  "gradient_checkpointing": True}})):
        ctx.reset()
        spec = _llm_spec(ctx, root, name, **over)
        out, run = _train(ctx, spec, name)
        rows[name] = _llm_row(ctx, spec, out, run)
        if name == "seq2048":
            ctx.lorapod_tokens_s = rows[name]["real_tokens_per_s"]
        del out
    return rows


def check_qlora(ctx: Ctx) -> dict:
    """QLoRA (nf4) + 8-bit AdamW + checkpointing on the same model: bitsandbytes runs, what stays 16-bit (G10)."""
    if not ctx.cuda:
        return {"skipped": "QLoRA and 8-bit AdamW need CUDA (bitsandbytes)"}
    root = _llm_assets(ctx)
    ctx.reset()
    spec = _llm_spec(ctx, root, "qlora", method={"type": "qlora"},
                     train={"optimizer": "adamw_8bit", "gradient_checkpointing": True, "max_steps": 6})
    out, run = _train(ctx, spec, "qlora")
    row = _llm_row(ctx, spec, out, run)
    base = out.recipe.model.get_base_model()
    row["dtypes"] = {"embed": str(base.get_input_embeddings().weight.dtype),
                     "head": str(base.get_output_embeddings().weight.dtype),
                     "norm": str(base.model.norm.weight.dtype)}
    return row


def check_sdxl(ctx: Ctx) -> dict:
    """bench/image_gpu.py in this process: the full SDXL UNet at 1024 px, LoRA r16, GC, bf16."""
    import image_gpu

    return image_gpu.main(["--smoke", "--steps", "2", "--gpu", ctx.gpu] if ctx.smoke else ["--steps", "10"])


FLUX_DIT = dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=[16, 56, 56])
TINY_DIT = dict(FLUX_DIT, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=[4, 6, 6])


def check_dit(ctx: Ctx) -> dict:
    """A FLUX.1-width DiT (3072 wide; 2 double + 4 single blocks of the real 19 + 38) at 1024 px
    (4,096 image + 512 text tokens), LoRA on attention, one step: bf16 / fp8 storage, GC on / off (G3)."""
    from diffusers import FluxTransformer2DModel
    from peft import LoraConfig

    from lorapod.engine.diffusion import attach_lora, store_fp8

    cfg = TINY_DIT if ctx.smoke else FLUX_DIT
    img, txt = (16, 8) if ctx.smoke else (4096, 512)
    variants = [("bf16", True), ("bf16", False)]
    if ctx.cuda and torch.cuda.get_device_capability(0) >= (8, 9):
        variants += [("fp8", True), ("fp8", False)]
    rows = []
    for dtype, gc_on in variants:
        ctx.reset()
        torch.manual_seed(0)
        with torch.device(ctx.dev):
            dit = FluxTransformer2DModel(**cfg).to(torch.bfloat16 if ctx.cuda else torch.float32)
        dit.requires_grad_(False)
        if dtype == "fp8":
            store_fp8(dit)
        attach_lora(dit, LoraConfig(r=16, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        if gc_on:
            dit.enable_gradient_checkpointing()
        dit.train()
        resident = round(torch.cuda.memory_allocated() / GiB, 3) if ctx.cuda else None
        wd = torch.bfloat16 if ctx.cuda else torch.float32
        x = torch.randn(1, img, cfg["in_channels"], device=ctx.dev, dtype=wd)
        enc = torch.randn(1, txt, cfg["joint_attention_dim"], device=ctx.dev, dtype=wd)
        pooled = torch.randn(1, cfg["pooled_projection_dim"], device=ctx.dev, dtype=wd)
        side = int(img**0.5)
        grid = torch.meshgrid(torch.zeros(1), torch.arange(side).float(), torch.arange(side).float(), indexing="ij")
        img_ids = torch.stack(grid, -1).reshape(-1, 3).to(ctx.dev)
        txt_ids = torch.zeros(txt, 3, device=ctx.dev)

        inputs = {"hidden_states": x, "encoder_hidden_states": enc, "pooled_projections": pooled,
                  "timestep": torch.tensor([0.5], device=ctx.dev), "img_ids": img_ids, "txt_ids": txt_ids,
                  "guidance": torch.tensor([3.5], device=ctx.dev)}
        step = functools.partial(_dit_step, dit, inputs, ctx)
        sec = _timed(ctx, step, 1, 2 if ctx.smoke else 3)
        rows.append({"weights": dtype, "gradient_checkpointing": gc_on, "ms": round(sec * 1e3, 1),
                     "resident_gib": resident, "peak_gib": ctx.peak()})
        del dit, step
    return {"runs": rows}


def _dit_step(dit, inputs: dict, ctx: Ctx) -> None:
    with torch.autocast(ctx.dev.type, dtype=torch.bfloat16, enabled=ctx.cuda):
        pred = dit(**inputs).sample
    pred.float().square().mean().backward()


WAN_13B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
               text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def check_wan_blockswap(ctx: Ctx) -> dict:
    """Wan2.1 1.3B (30 blocks) + LoRA + GC with 20 blocks swapped (``wan.swap_blocks``), 480 x 832 x 17
    frames (7,800 tokens): swapped weights left on the GPU after backward (should be 0, G1), peak and
    step time with and without swap (the side-stream prefetch, G12)."""
    from diffusers import WanTransformer3DModel
    from peft import LoraConfig

    from lorapod.engine.diffusion import memory as wan
    from lorapod.engine.diffusion.families.wan import WAN_TARGETS
    from lorapod.engine.diffusion.lora import attach_lora

    ctx.reset()
    torch.manual_seed(0)
    if ctx.smoke:
        from lorapod.builtin.wan import tiny_wan_transformer

        tr, n_swap = tiny_wan_transformer(layers=3), 2
        shape, text = (1, 4, 1, 8, 8), (1, 16, 32)
    else:
        with torch.device(ctx.dev):
            tr = WanTransformer3DModel(**WAN_13B).to(torch.bfloat16)
        n_swap = 20
        shape, text = (1, 16, 5, 60, 104), (1, 512, 4096)
    tr.requires_grad_(False)
    attach_lora(tr, LoraConfig(r=16, lora_alpha=16, target_modules=WAN_TARGETS))
    wd = torch.bfloat16 if ctx.cuda else torch.float32
    args = {"hidden_states": torch.randn(*shape, device=ctx.dev, dtype=wd),
            "timestep": torch.tensor([500.0], device=ctx.dev),
            "encoder_hidden_states": torch.randn(*text, device=ctx.dev, dtype=wd)}

    def step():
        with torch.autocast(ctx.dev.type, dtype=torch.bfloat16, enabled=ctx.cuda):
            out = tr(**args).sample
        out.float().square().mean().backward()

    swap = wan.swap_blocks(tr, n_swap, ctx.dev)
    tr.train()
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    swapped_ms = _timed(ctx, step, 1, 2) * 1e3
    frozen = [p for b in swap.blocks for p, _ in swap._frozen(b)]
    left = sum(p.numel() * p.element_size() for p in frozen if p.device.type == "cuda") / GiB
    row = {"blocks": len(tr.blocks), "swapped": n_swap, "swapped_gib": round(
        sum(p.numel() * p.element_size() for p in frozen) / GiB, 3), "left_on_gpu_after_backward_gib": round(left, 3),
        "moves": swap.moves, "with_swap": {"ms": round(swapped_ms, 1), "peak_gib": ctx.peak()}}
    swap.remove()
    ctx.reset()
    row["without_swap"] = {"ms": round(_timed(ctx, step, 1, 2) * 1e3, 1), "peak_gib": ctx.peak()}
    try:
        from lorapod.catalog.models import find_model
        from lorapod.plan.vram import Settings

        model = find_model("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
        for key, k in (("with_swap", 20), ("without_swap", 0)):  # the real-sized job, with --smoke too
            s = Settings(base_dtype="bf16", r=16, targets="all-linear", optimizer="adamw", gradient_checkpointing=True,
                         batch=1, resolution=632, frames=17, image_tokens=7800, blocks_to_swap=k, framework="lorapod")
            row[key]["planner"] = _planned(ctx, model, s)
    except Exception as exc:
        row["planner"] = {"error": f"{type(exc).__name__}: {exc}"}
    return row


def check_oom(ctx: Ctx) -> dict:
    """What the user sees when a step runs out of memory (G11): on CUDA the LLM at 8,192 tokens x 8
    under a 4 GiB cap; with --smoke an OutOfMemoryError raised in step 2, as CUDA would."""
    from lorapod.engine.llm import LLMRecipe
    from lorapod.errors import OutOfMemory

    root = _llm_assets(ctx)
    ctx.reset()
    real_loss = LLMRecipe.loss
    calls = {"n": 0}
    if ctx.cuda:
        spec = _llm_spec(ctx, root, "oom", data={"sequence_len": 8192}, train={"micro_batch_size": 8, "max_steps": 2})
        torch.cuda.set_per_process_memory_fraction(4 * GiB / torch.cuda.get_device_properties(0).total_memory)
    else:
        spec = _llm_spec(ctx, root, "oom", train={"max_steps": 3})

        def loss(self, batch):
            calls["n"] += 1
            if calls["n"] == 3:  # grad_accum 2: step 2's first micro-batch
                raise torch.OutOfMemoryError("CUDA out of memory (raised by gpu_check --smoke)")
            return real_loss(self, batch)

        LLMRecipe.loss = loss
    try:
        _train(ctx, spec, "oom")
        return {"error": "no out-of-memory error under the cap"}
    except OutOfMemory as exc:
        rec = {"raised": type(exc).__name__, "message": exc.message, "hint": exc.hint, "step": exc.step,
               "checkpoint": str(exc.checkpoint) if exc.checkpoint else None, "peak_gib": exc.peak_gb,
               "planned_gib": exc.planned_gb}
    finally:
        LLMRecipe.loss = real_loss
    try:
        rec["resume"] = _resume_after_oom(ctx, spec, rec)
    finally:
        if ctx.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
    return rec


def _resume_after_oom(ctx: Ctx, spec, rec: dict) -> dict:
    """What the hint says, done: ``--resume`` with its ``--set`` changes (still under the cap), when
    the checkpoint survives them; the run must then reach its last step."""
    import re

    from lorapod.engine.llm import train_llm
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    sets = re.findall(r"--set (\S+)", rec.get("hint") or "")
    if not rec.get("checkpoint") or "continue with: lorapod train --resume" not in (rec.get("hint") or ""):
        return {"skipped": "the hint offers no resume (a new run): " + " ".join(sets)}
    run = RunDir.open(Path(rec["checkpoint"]).parents[1])
    resumed = load_spec(raw=spec.model_dump(mode="json"), overrides=sets)
    ctx.reset()
    out = train_llm(resumed, run, resume=True, device=str(ctx.dev), show_progress=False, log=lambda m: None)
    return {"sets": sets, "last_step": out.result.state.step, "max_steps": resumed.train.max_steps,
            "peak_gib": ctx.peak()}


# name -> (function, rough seconds on an H200), in the order they run: what the first real run must
# settle first (N1-N4, N7, the LLM standard), then the image checks the budget may leave out
CHECKS = {
    "env": (check_env, 5),
    "peak": (check_peak, 5),
    "attention": (check_attention, 15),
    "packed_attention": (check_packed_attention, 15),
    "flex": (check_flex, 90),
    "llm_lora": (check_llm_lora, 80),
    "trl_varlen": (check_trl_varlen, 50),
    "qlora": (check_qlora, 50),
    "oom": (check_oom, 40),
    "sdxl": (check_sdxl, 45),
    "dit": (check_dit, 35),
    "wan_blockswap": (check_wan_blockswap, 55),
}


def _say(name: str, rec: dict) -> str:
    """One line per check: the measurement, and the planner's figure beside it where there is one."""
    if "error" in rec:
        return f"{name}: ERROR {rec['error']}"
    if "skipped" in rec:
        return f"{name}: skipped ({rec['skipped']})"
    flat = json.dumps({k: v for k, v in rec.items() if k not in ("traceback",)}, default=str)
    return f"{name} ({rec.get('seconds', 0):.0f} s): {flat[:600]}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json (nothing else is written there)")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the checks' work files (default: a temporary folder, removed at the end)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script, not a GPU")
    ap.add_argument("--budget", type=float, default=450, help="seconds; a check that would pass it is skipped")
    ap.add_argument("--only", default=None, help="comma-separated checks: " + ",".join(CHECKS))
    ap.add_argument("--gpu", default="H200", help="the planner's GPU with --smoke")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run with --smoke to check the script on CPU")
    if args.smoke:
        torch.set_num_threads(min(4, torch.get_num_threads()))
    import shutil
    import tempfile

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    if work.resolve().is_relative_to(args.out.resolve()):
        sys.exit("--work must be outside --out (the result folder gets gpu_check.json only)")
    ctx = Ctx(args.smoke, args.out, args.budget, args.gpu, work)
    from lorapod.engine.llm import quiet_hf

    quiet_hf()
    names = args.only.split(",") if args.only else list(CHECKS)
    report: dict = {"smoke": args.smoke, "device": ctx.gpu if ctx.cuda else "cpu", "checks": {}}
    path = args.out / "gpu_check.json"
    for name in names:
        fn, cost = CHECKS[name]
        left = ctx.deadline - time.time()
        if not args.smoke and cost > left:
            rec: dict = {"skipped": f"about {cost} s needed, {left:.0f} s of the budget left"}
        else:
            t0 = time.time()
            try:
                rec = fn(ctx)
            except Exception as exc:  # one failing check does not stop the others
                rec = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:400] if str(exc) else ''}",
                       "traceback": traceback.format_exc()[-3000:]}
            rec["seconds"] = round(time.time() - t0, 1)
            ctx.reset()
        report["checks"][name] = rec
        path.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
        print(_say(name, rec), flush=True)
    print(f"wrote {path}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    main()
