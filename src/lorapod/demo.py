"""``lorapod demo``: the whole LLM path, offline, on a CPU, in about two minutes.

It writes a chat dataset that teaches one behaviour (answering "what colour is X?" with "The X is
Y."), trains a LoRA on it with the real engine, and reports base vs tuned validation loss and
generations. With no ``--model`` the base is the built-in tiny Llama (``lorapod.builtin.llm``:
random weights and a byte-level BPE tokenizer, built in code into ``--out``). A random base model
obviously lacks the behaviour; the point is that the loop, masking, packing, checkpoints and the
PEFT adapter are the same ones a real job uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lorapod.builtin.llm import VAL_QUESTIONS, build_base_model, build_dataset, demo_texts
from lorapod.spec import load_spec


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@dataclass
class DemoResult:
    out: Path
    base_val_loss: float | None
    tuned_val_loss: float | None
    samples: list[tuple[str, str, str]]  # question, base answer, tuned answer


def demo_spec_dict(out: Path, model_id: str, steps: int | None) -> dict:
    return {
        "model": {"id": model_id, "family": "llm"},
        "method": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "data": {
            "path": str(out / "data" / "train.jsonl"), "val_path": str(out / "data" / "val.jsonl"),
            "format": "messages", "sequence_len": 256, "packing": True,
        },
        "train": {
            "epochs": 40, "max_steps": steps, "micro_batch_size": 2, "grad_accum": 1, "learning_rate": 3e-3,
            "scheduler": "cosine", "warmup_steps": 10, "precision": "auto", "seed": 0, "max_grad_norm": 1.0,
        },
        "eval": {"every_steps": 80, "at_start": True},
        "save": {"every_steps": 80, "every_epochs": None, "keep_last": 2},
        "output": {"dir": str(out / "runs"), "name": "demo"},
    }


def run_demo(out: Path, model: str | None = None, steps: int | None = None, log=print,
             show_progress: bool | None = None) -> DemoResult:
    import shutil

    from lorapod.engine.llm import generate, quiet_hf, train_llm
    from lorapod.rundir import RunDir

    quiet_hf()
    import torch

    # As the image and video demos do: a ~1M-parameter model's matmuls are too small for threads to
    # pay, and on a busy machine OpenMP's spinning threads contend. Measured on this project's loaded
    # 2-core box (load average 12): `lorapod demo --steps 40` took 47 s on one thread, 245 s on two.
    torch.set_num_threads(1)

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    train, val = build_dataset()
    write_jsonl(out / "data" / "train.jsonl", train)
    write_jsonl(out / "data" / "val.jsonl", val)
    if model is None:
        log("building a small Llama-architecture model and tokenizer locally (no download)...")
        model_id = str(build_base_model(out / "base-model", demo_texts(train, val)))
    else:
        model_id = model
    spec = load_spec(raw=demo_spec_dict(out, model_id, steps))
    run = RunDir.create(out / "runs", "demo")
    run.write_spec(spec)
    log(f"run folder: {run.root}")
    trained = train_llm(spec, run, log=log, show_progress=show_progress)

    recipe = trained.recipe
    samples = []
    for x in ["banana", "plum", "olive"]:
        q = VAL_QUESTIONS[0].format(x=x)
        msgs = [{"role": "user", "content": q}]
        base = generate(recipe.model, recipe.tokenizer, msgs, 16, use_adapter=False)
        tuned = generate(recipe.model, recipe.tokenizer, msgs, 16, use_adapter=True)
        samples.append((q, base, tuned))

    # the files a user looks for, at the top of --out
    if (out / "adapter").exists():
        shutil.rmtree(out / "adapter")
    shutil.copytree(run.adapter, out / "adapter")
    shutil.copy2(run.metrics_file, out / run.metrics_file.name)
    if (run.root / "loss.png").exists():
        shutil.copy2(run.root / "loss.png", out / "loss.png")
    shutil.copy2(run.spec_file, out / "spec.yaml")
    first = (trained.result.first_eval or {}).get("val_loss")
    last = (trained.result.last_eval or {}).get("val_loss")
    return DemoResult(out, first, last, samples)
