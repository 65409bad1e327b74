"""Tiny LLM models and tokenizers built in code, shared by the engine tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

from lorapod import demo
from lorapod.builtin import llm


def make_model_dir(root: Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    train, val = llm.build_dataset()
    return llm.build_base_model(root / "base", llm.demo_texts(train, val), seed=seed, hidden=hidden, layers=layers)


def write_data(root: Path) -> tuple[Path, Path]:
    train, val = llm.build_dataset()
    demo.write_jsonl(root / "train.jsonl", train)
    demo.write_jsonl(root / "val.jsonl", val)
    return root / "train.jsonl", root / "val.jsonl"


def spec_dict(model_dir: Path, train: Path, val: Path, out: Path, **train_overrides) -> dict:
    t = {"epochs": 1, "micro_batch_size": 2, "grad_accum": 2, "learning_rate": 5e-3, "seed": 0,
         "warmup_steps": 2, "scheduler": "cosine"}
    t.update(train_overrides)
    return {
        "model": {"id": str(model_dir), "family": "llm"},
        "method": {"r": 8, "alpha": 16, "dropout": 0.1},
        "data": {"path": str(train), "val_path": str(val), "sequence_len": 128, "packing": True},
        "train": t,
        "eval": {"every_steps": 4, "max_batches": 2},
        "save": {"every_steps": 3, "every_epochs": None, "keep_last": 10},
        "output": {"dir": str(out), "name": "t"},
    }


def make_assets(root: Path) -> tuple[Path, Path, Path, Path]:
    """(root, model folder, train.jsonl, val.jsonl): what the engine tests' module fixtures share."""
    model_dir = make_model_dir(root)
    train, val = write_data(root)
    return root, model_dir, train, val
