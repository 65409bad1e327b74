"""How long the save on a preemption's SIGTERM takes for real-size adapters: does it fit RunPod's 5 s?

    PYTHONPATH=src python bench/spot_save.py [--dir DIR] [--repeats 3]

For each job it builds the trainable LoRA tensors of that shape (random values; sizes from the
catalog: ``lora_params_per_rank_m`` x rank for an image model, ``lora_params(r, targets)`` for an
LLM), an AdamW over them stepped once (so its state is the real one: step, exp_avg,
exp_avg_sq), and times :meth:`lorapod.engine.checkpoint.CheckpointManager.save`, the very call the
training loop makes: safetensors for the adapter and the optimizer, the RNG states, the sha256
manifest, fsync of every file, the rename. It also times a plain write + fsync of the same bytes,
which is the disk rate the planner's estimate uses (:data:`lorapod.plan.spot.LOCAL_DISK_MB_S`).

Jobs: SDXL rank 16 (the U-Net's LoRA, catalog ``lora_params_per_rank_m`` 2.66 -> 42.6 M params) and
Qwen2.5 7B rank 16 on all linear layers (28 layers x 7 projections: 40.4 M params). Prints a
markdown table: MB written, seconds per save (best and median of ``--repeats``: on a shared
machine the best is the one least slowed by others), the whole save's MB/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from lorapod.catalog.models import find_model
from lorapod.engine.checkpoint import CheckpointManager, TrainState


def sdxl_shapes(rank: int) -> list[tuple[int, int]]:
    """(in, out) pairs whose LoRA params total the catalog's count for SDXL at ``rank``: the
    attention projections of the U-Net's transformer blocks, 640 and 1280 wide (bench-only: the
    split among matrices hardly changes the write time, the total does)."""
    total = find_model("sdxl").lora_params_per_rank_m * 1e6 * rank
    shapes, n = [], 0
    while n < total:
        c = 640 if len(shapes) % 3 == 0 else 1280
        shapes.append((c, c))
        n += rank * (c + c)
    return shapes


def llm_shapes(model_id: str, rank: int) -> list[tuple[int, int]]:
    m = find_model(model_id)
    total = m.lora_params(rank, "all-linear")
    shapes, n = [], 0
    h = 3584  # Qwen2.5 7B's hidden size; the total is the catalog's
    while n < total:
        shapes.append((h, h))
        n += rank * 2 * h
    return shapes


def build(shapes: list[tuple[int, int]], rank: int) -> tuple[dict[str, torch.Tensor], dict]:
    params = []
    for din, dout in shapes:
        a = torch.nn.Parameter(torch.randn(rank, din) * 0.01)
        b = torch.nn.Parameter(torch.randn(dout, rank) * 0.01)
        params += [a, b]
    opt = torch.optim.AdamW(params, lr=1e-4)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    adapter = {f"m{i // 2}.lora_{'AB'[i % 2]}.weight": p.detach() for i, p in enumerate(params)}
    return adapter, {"optimizer": opt.state_dict(), "scheduler": {"last_epoch": 1}}


def plain_write(folder: Path, nbytes: int) -> float:
    data = os.urandom(1 << 24)
    t0 = time.perf_counter()
    with open(folder / "plain.bin", "wb") as fh:
        left = nbytes
        while left > 0:
            fh.write(data[: min(left, len(data))])
            left -= len(data)
        fh.flush()
        os.fsync(fh.fileno())
    dt = time.perf_counter() - t0
    (folder / "plain.bin").unlink()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    jobs = [("SDXL r16 (U-Net LoRA)", sdxl_shapes(16)), ("Qwen2.5 7B r16 all-linear", llm_shapes("Qwen/Qwen2.5-7B", 16))]
    print("| job | LoRA params | checkpoint MB | save s (best) | save s (median) | plain write+fsync s (best) | "
          "save MB/s (best) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="lp-spot-save-") as tmp:
        root = Path(tmp)
        for name, shapes in jobs:
            adapter, opt = build(shapes, 16)
            params = sum(v.numel() for v in adapter.values())
            mgr = CheckpointManager(root / name.split()[0], keep_last=1)
            times, size = [], 0
            for k in range(args.repeats):
                t0 = time.perf_counter()
                path = mgr.save(TrainState(step=k + 1), adapter, opt)
                times.append(time.perf_counter() - t0)
                size = sum(f.stat().st_size for f in path.iterdir())
            plain = min(plain_write(root, size) for _ in range(args.repeats))
            print(f"| {name} | {params / 1e6:.1f} M | {size / 1e6:.0f} | {min(times):.2f} | {statistics.median(times):.2f} | "
                  f"{plain:.2f} | {size / 1e6 / min(times):.0f} |", flush=True)
            del adapter, opt


if __name__ == "__main__":
    main()
