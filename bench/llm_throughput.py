"""LLM LoRA throughput: lorapod vs Hugging Face Trainer + PEFT (dynamic padding) vs TRL SFTTrainer (packing).

Same model (built from a config, ~30M parameters), same tokenizer, same tokenized examples with a
long-tailed length spread (log-normal, as real chat data is), same LoRA config, same learning rate,
one epoch each. Every variant runs in its own subprocess so peak RSS is its own; validation loss is
measured afterwards by one neutral function (each validation example alone, plain forward).

    python bench/llm_throughput.py                 # all variants, prints a markdown table
    python bench/llm_throughput.py --examples 512  # more data

Non-padding tokens/s = tokens of real examples processed per second of training (padding excluded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = [f"w{i}" for i in range(3000)]


def build_assets(root: Path, n_examples: int, seed: int = 0) -> None:
    """Tokenizer + model folder + train/val chat JSONL with log-normal lengths."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(HERE.parent / "src"))
    from lorapod.builtin.llm import build_tokenizer

    rng = random.Random(seed)

    def sentence(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def example() -> dict:
        n_user = max(3, int(rng.lognormvariate(3.3, 0.8)))
        n_asst = max(3, int(rng.lognormvariate(3.8, 0.9)))
        n_asst = min(n_asst, 700)
        return {"messages": [{"role": "user", "content": sentence(min(n_user, 200))},
                             {"role": "assistant", "content": sentence(n_asst)}]}

    train = [example() for _ in range(n_examples)]
    val = [example() for _ in range(max(16, n_examples // 16))]
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [" ".join(WORDS)] + [m["content"] for r in train[:200] for m in r["messages"]]
    tok = build_tokenizer(texts, vocab_size=4096)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")


def tokenized(root: Path, split: str, seq_len: int):
    """The same tokenized examples for every variant (lorapod's renderer and masking)."""
    from transformers import AutoTokenizer

    from lorapod.chat.tokenize import tokenize_all
    from lorapod.data.chat import load_conversations

    tok = AutoTokenizer.from_pretrained(root / "model")
    convs, _f, _fmt = load_conversations(root / f"{split}.jsonl")
    examples, _stats = tokenize_all(tok, convs, seq_len)
    return tok, examples


LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
LR = 2e-4
BATCH = 8


def run_lorapod(root: Path, out: Path, seq_len: int, steps: int) -> dict:
    from lorapod.engine.llm import train_llm
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    _tok, examples = tokenized(root, "train", seq_len)
    from lorapod.engine import llm_data

    rows = llm_data.pack(examples, seq_len)
    mb = max(1, math.ceil(len(rows) / steps))
    spec = load_spec(raw={
        "model": {"id": str(root / "model"), "family": "llm"},
        "method": LORA,
        "data": {"path": str(root / "train.jsonl"), "val_path": str(root / "val.jsonl"), "sequence_len": seq_len,
                 "packing": True},
        "train": {"epochs": 1, "micro_batch_size": mb, "learning_rate": LR, "scheduler": "constant", "seed": 0,
                  "max_grad_norm": 1.0},
        "eval": {"at_start": False, "every_steps": 10_000},
        "save": {"every_steps": None, "every_epochs": None},
        "output": {"dir": str(out / "runs"), "name": "bench"},
    })
    run = RunDir.create(spec.output.dir, "bench")
    t0 = time.perf_counter()
    res = train_llm(spec, run, show_progress=False, log=lambda m: None)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in run.metrics_file.read_text().splitlines()]
    train_time = sum(r["step_time_s"] for r in recs if "step_time_s" in r)
    real = sum(len(e) for e in examples)
    res.recipe.model.save_pretrained(out / "adapter")
    return {"steps": res.result.state.step, "train_s": train_time, "wall_s": wall, "real_tokens": real,
            "padded_tokens": sum(r["tokens_per_s"] * r["step_time_s"] for r in recs if "step_time_s" in r)}


def _hf_dataset(examples):
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in examples])


class _Timer:
    """Trainer callback: time only the optimizer steps (not model loading)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class T(TrainerCallback):
            def __init__(self):
                self.t0 = None
                self.elapsed = 0.0

            def on_step_begin(self, args, state, control, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                self.elapsed += time.perf_counter() - self.t0

        return T()


def run_trainer(root: Path, out: Path, seq_len: int, steps: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    tok, examples = tokenized(root, "train", seq_len)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(root / "model", attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    bs = max(1, math.ceil(len(examples) / steps))
    args = TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=bs, num_train_epochs=1,
                             learning_rate=LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                             max_grad_norm=1.0, warmup_steps=0)
    timer = _Timer()
    trainer = Trainer(model=model, args=args, train_dataset=_hf_dataset(examples),
                      data_collator=DataCollatorForSeq2Seq(tok, padding="longest", label_pad_token_id=-100),
                      callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    model.save_pretrained(out / "adapter")
    return {"steps": trainer.state.global_step, "train_s": timer.elapsed, "wall_s": wall,
            "real_tokens": sum(len(e) for e in examples)}


def run_trl(root: Path, out: Path, seq_len: int, steps: int) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok, examples = tokenized(root, "train", seq_len)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(root / "model", attn_implementation="sdpa")
    # TRL packs with best-fit decreasing and restarts position_ids per example ("padding-free")
    ds = _hf_dataset(examples).map(lambda r: {"completion_mask": [int(x != -100) for x in r["labels"]]})
    ds = ds.remove_columns(["labels"])
    n_rows_guess = math.ceil(sum(len(e) for e in examples) / seq_len)
    bs = max(1, math.ceil(n_rows_guess / steps))
    cfg = SFTConfig(output_dir=str(out / "trl"), per_device_train_batch_size=bs, num_train_epochs=1,
                    learning_rate=LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                    logging_strategy="no", use_cpu=True, seed=0, packing=True, max_length=seq_len,
                    completion_only_loss=True, dataset_num_proc=None, max_grad_norm=1.0, warmup_steps=0)
    timer = _Timer()
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                         peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                                target_modules="all-linear", task_type="CAUSAL_LM"),
                         callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(out / "adapter")
    return {"steps": trainer.state.global_step, "train_s": timer.elapsed, "wall_s": wall,
            "real_tokens": sum(len(e) for e in examples)}


def neutral_val_loss(root: Path, adapter: Path, seq_len: int) -> float:
    import torch
    import torch.nn.functional as F
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _tok, examples = tokenized(root, "val", seq_len)
    model = AutoModelForCausalLM.from_pretrained(root / "model")
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for e in examples:
            logits = model(input_ids=torch.tensor([e.input_ids])).logits[0, :-1]
            labels = torch.tensor(e.labels[1:])
            keep = labels != -100
            total += float(F.cross_entropy(logits[keep], labels[keep], reduction="sum"))
            n += int(keep.sum())
    return total / n


VARIANTS = {"lorapod": run_lorapod, "hf-trainer-padded": run_trainer, "trl-sft-packed": run_trl}


def child(variant: str, root: Path, out: Path, seq_len: int, steps: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = VARIANTS[variant](root, out, seq_len, steps)
    res["val_loss"] = neutral_val_loss(root, out / "adapter", seq_len)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    (out / "result.json").write_text(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16, help="target optimizer steps per variant (one epoch)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lorapod-bench-llm"))
    ap.add_argument("--only", default=None)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent / "src"))
    if args.child:
        child(args.child, args.work, args.work / args.child, args.seq_len, args.steps)
        return
    if not (args.work / "model" / "config.json").exists():
        build_assets(args.work, args.examples)
    results = {}
    for name in (args.only.split(",") if args.only else VARIANTS):
        out = args.work / name
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--work", str(args.work),
                               "--seq-len", str(args.seq_len), "--steps", str(args.steps)], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[name] = json.loads((out / "result.json").read_text())
    base = results.get("hf-trainer-padded")
    print(f"\n{args.examples} examples, seq_len {args.seq_len}, torch threads {os.cpu_count()} cores, CPU fp32\n")
    print("| variant | optimizer steps | train s | wall s | non-padding tok/s | ratio vs Trainer | peak RSS GB | val loss |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        tps = r["real_tokens"] / r["train_s"]
        ratio = tps / (base["real_tokens"] / base["train_s"]) if base else float("nan")
        print(f"| {name} | {r['steps']} | {r['train_s']:.1f} | {r['wall_s']:.1f} | {tps:,.0f} | {ratio:.2f}x | "
              f"{r['peak_rss_gb']:.2f} | {r['val_loss']:.4f} |")


if __name__ == "__main__":
    main()
