"""Benchmark: data-parallel scaling of the LLM engine, 1 vs 2 processes, same global batch.

    python bench/ddp_scaling.py [--steps 30] [--hidden 256] [--layers 4] [--device cpu]

Builds a small Llama-architecture model and the demo's chat data, then trains the same spec
(micro_batch_size 2 x grad_accum 4 = global batch 8 rows of 256 tokens, packed) with
``lorapod train`` in 1 process and with ``--processes 2`` (torchrun; gloo on CPU with one thread
per process, NCCL with one GPU per process on a CUDA machine). Throughput is the median over
steps after the first 5 of the tokens each optimizer step trained / its wall time on rank 0
(``metrics.jsonl``). The communication share is the median time of the one gradient all-reduce
DDP does per step (the LoRA parameters' count of float32, same backend, 2 processes), measured
alone, over the 2-process step time. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lorapod import demo
from lorapod.builtin import llm

WARMUP = 5


def build(root: Path, hidden: int, layers: int, steps: int, device: str) -> Path:
    train, val = llm.build_dataset()
    train = train * 4  # more rows than steps x global batch need
    model = llm.build_base_model(root / "base", llm.demo_texts(train, val), seed=0, hidden=hidden, layers=layers)
    demo.write_jsonl(root / "train.jsonl", train)
    demo.write_jsonl(root / "val.jsonl", val)
    spec = {
        "model": {"id": str(model), "family": "llm"},
        "method": {"r": 16, "alpha": 32, "dropout": 0.0},
        "data": {"path": str(root / "train.jsonl"), "val_path": str(root / "val.jsonl"), "sequence_len": 256,
                 "packing": True},
        "train": {"max_steps": steps, "micro_batch_size": 2, "grad_accum": 4, "learning_rate": 2e-4,
                  "scheduler": "constant", "seed": 0, "precision": "fp32" if device == "cpu" else "auto"},
        "eval": {"at_start": False, "every_steps": 10_000, "max_batches": 1},
        "save": {"every_steps": None, "every_epochs": None},
        "output": {"dir": str(root / "runs"), "name": "ddp"},
    }
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def train(spec: Path, run: Path, processes: int, device: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "lorapod", "train", str(spec), "--run-dir", str(run), "--device", device]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r][WARMUP:]
    return {
        "tok_s": statistics.median(r["tokens_per_s"] for r in steps),
        "step_s": statistics.median(r["step_time_s"] for r in steps),
        "losses": [r["loss"] for r in recs if "loss" in r],
        "wall": wall,
    }


def _allreduce_worker(rank: int, world: int, numel: int, iters: int, port: int, out: str, backend: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    t = torch.ones(numel, device=dev)
    times = []
    for _ in range(iters):
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize()
        s = time.perf_counter()
        dist.all_reduce(t)
        if backend == "nccl":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - s)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def allreduce_seconds(numel: int, backend: str, iters: int = 50) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    mp.spawn(_allreduce_worker, args=(2, numel, iters, port, out, backend), nprocs=2, join=True)
    return statistics.median(json.loads(Path(out).read_text())[5:])


def lora_numel(spec: Path) -> int:
    from lorapod.engine.llm import prepare
    from lorapod.spec import load_spec

    recipe, _stats, _fb = prepare(load_spec(spec), "cpu", log=lambda m: None)
    return sum(p.numel() for p in recipe.trainable_parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lorapod-ddp-"))
    spec = build(root, a.hidden, a.layers, a.steps, a.device)
    one = train(spec, root / "one", 1, a.device)
    two = train(spec, root / "two", 2, a.device)
    numel = lora_numel(spec)
    comm = allreduce_seconds(numel, "nccl" if a.device.startswith("cuda") else "gloo")
    drift = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(one["losses"], two["losses"], strict=True))
    print(f"model hidden {a.hidden} x {a.layers} layers; LoRA r16 on all linear layers: {numel:,} float32 "
          f"gradients all-reduced per step; global batch 8 rows x 256 tokens; {a.steps} steps, median after {WARMUP}")
    print()
    print("| processes | step s | tokens/s | speed-up | comm s/step | comm share | wall s | max loss rel. diff vs 1 |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| 1 | {one['step_s']:.3f} | {one['tok_s']:,.0f} | 1.00x | - | - | {one['wall']:.1f} | - |")
    print(f"| 2 | {two['step_s']:.3f} | {two['tok_s']:,.0f} | {two['tok_s'] / one['tok_s']:.2f}x | {comm * 1e3:.2f} ms"
          f" | {comm / two['step_s']:.1%} | {two['wall']:.1f} | {drift:.1e} |")


if __name__ == "__main__":
    main()
