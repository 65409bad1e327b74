"""Benchmark: host RAM of FSDP2's model load per process (review G14), 2 processes.

    python bench/fsdp_host_ram.py [--hidden 768] [--layers 12] [--device cpu]

Builds a Llama-architecture base of that size (random weights, fp32 on the CPU) and the demo's
chat data, then runs ``lorapod train`` under torchrun with ``train.parallel: fsdp`` for one
optimizer step. Each process reports, right after the base is sharded (``LLMRecipe.shard``), the
peak resident memory of its process so far (``ru_maxrss``) and what it held before the load (the
same figure at the start of ``prepare``), and whether it opened a weight file. With rank 0 alone
reading the base, rank 1's growth is its shard, not the whole base. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

_RANK = """
import json, os, resource, sys

import safetensors
import safetensors.torch

opened = []
_real = safetensors.safe_open


def _spy(path, *args, **kwargs):
    opened.append(str(path))
    return _real(path, *args, **kwargs)


safetensors.safe_open = safetensors.torch.safe_open = _spy

from lorapod.engine import llm
from lorapod.cli.main import main

seen = {}
_prepare, _shard = llm.prepare, llm.LLMRecipe.shard


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare(*args, **kwargs):
    seen["before_mb"] = rss_mb()
    return _prepare(*args, **kwargs)


def shard(self, world):
    _shard(self, world)
    seen["after_shard_mb"] = rss_mb()


llm.prepare, llm.LLMRecipe.shard = prepare, shard
try:
    main(sys.argv[1:])
finally:
    seen["opened_weights"] = sum(p.endswith(".safetensors") for p in opened)
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from lorapod import demo
    from lorapod.builtin import llm

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train, val = llm.build_dataset()
        model = llm.build_base_model(root / "base", llm.demo_texts(train, val), hidden=args.hidden, layers=args.layers)
        demo.write_jsonl(root / "train.jsonl", train)
        demo.write_jsonl(root / "val.jsonl", val)
        weights = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20
        spec = {
            "model": {"id": str(model), "family": "llm"},
            "method": {"r": 8, "alpha": 16, "dropout": 0.0},
            "data": {"path": str(root / "train.jsonl"), "val_path": str(root / "val.jsonl"),
                     "sequence_len": 128, "packing": True},
            "train": {"micro_batch_size": 1, "grad_accum": 2, "max_steps": 1, "parallel": "fsdp", "seed": 0},
            "eval": {"at_start": False, "every_steps": None},
            "save": {"every_steps": None, "every_epochs": None},
            "output": {"dir": str(root / "runs"), "name": "ram"},
        }
        (root / "spec.yaml").write_text(yaml.safe_dump(spec))
        (root / "rank.py").write_text(_RANK)
        out = root / "out"
        out.mkdir()
        env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                              os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        str(root / "rank.py"), "train", str(root / "spec.yaml"), "--run-dir", str(root / "run"),
                        "--device", args.device], env=env, check=True, capture_output=True)
        print(f"base: hidden {args.hidden}, {args.layers} layers, {weights:,.0f} MiB of safetensors (fp32)\n")
        print("| rank | weight files opened | peak RSS before load (MiB) | peak RSS after shard (MiB) | growth (MiB) |")
        print("|---|---|---|---|---|")
        for r in (0, 1):
            d = json.loads((out / f"rank{r}.json").read_text())
            print(f"| {r} | {d['opened_weights']} | {d['before_mb']:,.0f} | {d['after_shard_mb']:,.0f} | "
                  f"{d['after_shard_mb'] - d['before_mb']:,.0f} |")


if __name__ == "__main__":
    main()
