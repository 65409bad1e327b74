"""LLM LoRA throughput: lorapod vs Hugging Face Trainer + PEFT (dynamic padding) vs TRL SFTTrainer
(packing, padding-free: restarting position_ids, no padding).

Same model (built from a config with random weights: ~30M parameters, or Qwen2.5-0.5B / 7B shaped
with ``--shape``), same tokenizer, same tokenized examples with a long-tailed length spread
(log-normal, as real chat data is), same LoRA config, same learning rate, one epoch each, on the same
device in the same precision (``--device cpu``: fp32; ``--device cuda``: bf16 base weights and bf16
autocast for all three, SDPA attention). Every variant runs in its own subprocess so its peak memory
is its own; validation loss is measured afterwards by one neutral function (each validation example
alone, plain forward).

    python bench/llm_throughput.py                                        # CPU, tiny model
    python bench/llm_throughput.py --device cuda --shape qwen2.5-0.5b     # a GPU, Qwen2.5-0.5B shape
    python bench/llm_throughput.py --device cuda --shape qwen2.5-7b --seq-len 2048 --examples 512

Non-padding tokens/s = tokens of real examples per second of training (padding excluded), over the
optimizer steps after ``--warmup`` (default 2: cuBLAS/cuDNN setup, the allocator's first growth):
the epoch's real tokens per step on average, over the mean time of the steps kept. Memory: on CUDA
``torch.cuda.max_memory_allocated`` of the variant's process (GiB), on CPU its peak RSS. The planner's
columns: its peak (read as max_memory_allocated reads it) and tokens/s for the same job (its
``lorapod`` framework for lorapod, ``hf`` for the other two) on this GPU (``--gpu`` on CPU).
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


# Published configs (config.json of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-7B); random weights.
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152_064, tie_word_embeddings=False),
}


def build_assets(root: Path, n_examples: int, seed: int = 0, shape: str = "tiny", device: str = "cpu") -> None:
    """Tokenizer + model folder + train/val chat JSONL with log-normal lengths."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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
    if shape == "tiny":
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                          tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        model = LlamaForCausalLM(cfg)
    else:  # the real vocabulary's embedding and head (the tokenizer uses the first 4,096 ids)
        cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=32_768, rope_theta=1_000_000.0,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        with torch.device(device):  # initialising 7B parameters is minutes on a CPU, a second on a GPU
            model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
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


def run_lorapod(root: Path, out: Path, seq_len: int, steps: int, cuda: bool, warmup: int) -> dict:
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
                  "max_grad_norm": 1.0, "precision": "bf16" if cuda else "fp32"},
        "eval": {"at_start": False, "every_steps": 10_000},
        "save": {"every_steps": None, "every_epochs": None},
        "output": {"dir": str(out / "runs"), "name": "bench"},
    })
    run = RunDir.create(spec.output.dir, "bench")
    t0 = time.perf_counter()
    res = train_llm(spec, run, device="cuda" if cuda else "cpu", show_progress=False, log=lambda m: None)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in run.metrics_file.read_text().splitlines()]
    times = [r["step_time_s"] for r in recs if "step_time_s" in r]
    real = sum(len(e) for e in examples)
    res.recipe.model.save_pretrained(out / "adapter")
    return {"steps": res.result.state.step, "step_times": times, "wall_s": wall, "real_tokens": real, "batch": mb,
            "padded_tokens": sum(r["tokens_per_s"] * r["step_time_s"] for r in recs if "step_time_s" in r)}


def _hf_dataset(examples):
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in examples])


class _Timer:
    """Trainer callback: time each optimizer step (not model loading), waiting for the GPU at its end."""

    def __new__(cls):
        import torch
        from transformers import TrainerCallback

        class T(TrainerCallback):
            def __init__(self):
                self.t0 = None
                self.times: list[float] = []

            def on_step_begin(self, args, state, control, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                self.times.append(time.perf_counter() - self.t0)

        return T()


TORCH_VARLEN = "torch_varlen"


def register_torch_varlen() -> None:
    """``attn_implementation="torch_varlen"``: what transformers' ``flash_attention_2`` does with
    flash_attn's varlen function, on torch's own FlashAttention varlen kernel
    (``torch.nn.attention.varlen.varlen_attn``, torch >= 2.9): the attention TRL's padding-free
    training is built for, whose collator hands the model ``cu_seq_lens_q/k`` and ``max_length_q/k``
    computed on the CPU (``trl/trainer/sft_trainer.py``). flash-attn itself has no wheel on PyPI and
    is not in the rented images, so this is the standard that can run there. CUDA, fp16/bf16 only."""
    from torch.nn.attention.varlen import varlen_attn
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
               **kwargs):
        B, H, L, D = query.shape
        cu, m = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
        q, k, v = (t.transpose(1, 2).reshape(B * L, t.shape[1], D) for t in (query, key, value))
        window = (sliding_window - 1, 0) if sliding_window else (-1, 0)
        out = varlen_attn(q, k, v, cu.to(query.device), cu.to(query.device), m, m, scale=scaling,
                          window_size=window, enable_gqa=key.shape[1] != H)
        return out.reshape(B, L, H, D), None

    AttentionInterface.register(TORCH_VARLEN, attend)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TORCH_VARLEN, flash_attention_mask)


def _base(root: Path, cuda: bool, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM

    if attn == TORCH_VARLEN:
        register_torch_varlen()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(root / "model", attn_implementation=attn,
                                                dtype=torch.bfloat16 if cuda else torch.float32,
                                                device_map={"": 0} if cuda else None)


def _precision_args(cuda: bool) -> dict:
    """The same device and precision for the baselines as lorapod's: bf16 autocast on CUDA, fp32 on CPU."""
    return {"bf16": True, "use_cpu": False} if cuda else {"bf16": False, "use_cpu": True}


def run_trainer(root: Path, out: Path, seq_len: int, steps: int, cuda: bool, warmup: int) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    tok, examples = tokenized(root, "train", seq_len)
    model = _base(root, cuda)
    model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    bs = max(1, math.ceil(len(examples) / steps))
    args = TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=bs, num_train_epochs=1,
                             learning_rate=LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                             logging_strategy="no", seed=0, dataloader_num_workers=0,
                             max_grad_norm=1.0, warmup_steps=0, **_precision_args(cuda))
    timer = _Timer()
    trainer = Trainer(model=model, args=args, train_dataset=_hf_dataset(examples),
                      data_collator=DataCollatorForSeq2Seq(tok, padding="longest", label_pad_token_id=-100),
                      callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    model.save_pretrained(out / "adapter")
    return {"steps": trainer.state.global_step, "step_times": timer.times, "wall_s": wall, "batch": bs,
            "real_tokens": sum(len(e) for e in examples)}


def run_trl(root: Path, out: Path, seq_len: int, steps: int, cuda: bool, warmup: int, attn: str = "sdpa") -> dict:
    """TRL's SFTTrainer, packed and padding-free. ``attn``: ``sdpa`` (transformers then builds a dense
    packed mask: a weak baseline, review G5) or :data:`TORCH_VARLEN` (FlashAttention varlen: the
    standard lorapod is measured against on a GPU, bench/gpu_check.py)."""
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    tok, examples = tokenized(root, "train", seq_len)
    model = _base(root, cuda, attn)
    # TRL packs with best-fit decreasing and restarts position_ids per example ("padding-free")
    ds = _hf_dataset(examples).map(lambda r: {"completion_mask": [int(x != -100) for x in r["labels"]]})
    ds = ds.remove_columns(["labels"])
    n_rows_guess = math.ceil(sum(len(e) for e in examples) / seq_len)
    bs = max(1, math.ceil(n_rows_guess / steps))
    cfg = SFTConfig(output_dir=str(out / "trl"), per_device_train_batch_size=bs, num_train_epochs=1,
                    learning_rate=LR, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                    logging_strategy="no", seed=0, packing=True, padding_free=True, max_length=seq_len,
                    completion_only_loss=True, dataset_num_proc=None, max_grad_norm=1.0, warmup_steps=0,
                    **_precision_args(cuda))
    timer = _Timer()
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok,
                         peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                                target_modules="all-linear", task_type="CAUSAL_LM"),
                         callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(out / "adapter")
    return {"steps": trainer.state.global_step, "step_times": timer.times, "wall_s": wall, "batch": bs,
            "real_tokens": sum(len(e) for e in examples)}


def neutral_val_loss(root: Path, adapter: Path, seq_len: int, cuda: bool = False) -> float:
    import torch
    import torch.nn.functional as F
    from peft import PeftModel

    _tok, examples = tokenized(root, "val", seq_len)
    model = _base(root, cuda)
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    dev = "cuda" if cuda else "cpu"
    total, n = 0.0, 0
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda):
        for e in examples:
            logits = model(input_ids=torch.tensor([e.input_ids], device=dev)).logits[0, :-1].float()
            labels = torch.tensor(e.labels[1:], device=dev)
            keep = labels != -100
            total += float(F.cross_entropy(logits[keep], labels[keep], reduction="sum"))
            n += int(keep.sum())
    return total / n


VARIANTS = {"lorapod": run_lorapod, "hf-trainer-padded": run_trainer, "trl-sft-packed": run_trl}


FRAMEWORK = {"lorapod": "lorapod", "hf-trainer-padded": "hf", "trl-sft-packed": "hf"}


def child(variant: str, root: Path, out: Path, seq_len: int, steps: int, cuda: bool, warmup: int) -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = VARIANTS[variant](root, out, seq_len, steps, cuda, warmup)
    if cuda:
        res["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    res["val_loss"] = neutral_val_loss(root, out / "adapter", seq_len, cuda)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    (out / "result.json").write_text(json.dumps(res))


def steady(res: dict, warmup: int) -> tuple[float, int]:
    """(non-padding tokens/s over the steps after the warm-up, steps kept): the epoch's real tokens
    per step on average, over the mean time of the kept steps (all steps if there are too few)."""
    times = res["step_times"]
    kept = times[warmup:] if len(times) > warmup else times
    per_step = res["real_tokens"] / max(1, len(times))
    return per_step / (sum(kept) / len(kept)), len(kept)


def planned(root: Path, variant: str, batch: int, seq_len: int, gpu_name: str) -> dict | None:
    """The planner's peak (as max_memory_allocated reads it) and tokens/s for this variant's job."""
    try:
        from lorapod.catalog.gpus import find_gpu, gpu_from_device_name
        from lorapod.catalog.models import find_model
        from lorapod.plan.estimate import step_speed
        from lorapod.plan.vram import ASSISTANT_LABEL_FRACTION, Settings, estimate

        gpu = gpu_from_device_name(gpu_name) or find_gpu(gpu_name)
        model = find_model(str(root / "model"), "llm")
        s = Settings(base_dtype="bf16", r=LORA["r"], targets="all-linear", optimizer="adamw",
                     gradient_checkpointing=False, batch=batch, seq_len=seq_len, framework=FRAMEWORK[variant],
                     label_fraction=ASSISTANT_LABEL_FRACTION if variant == "lorapod" else 1.0)
        est = estimate(model, s)
        speed = step_speed(model, s, gpu, est, learn=False)
        return {"gpu": gpu.name, "peak_allocated_gib": est.read_as("allocated"),
                "tokens_per_s": batch * seq_len / speed.seconds_per_step}
    except Exception as exc:  # a bench: say why there is no prediction, keep the measurement
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16, help="target optimizer steps per variant (one epoch)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lorapod-bench-llm"))
    ap.add_argument("--only", default=None)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: all three variants on the GPU in bf16 (default cpu, fp32)")
    ap.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny",
                    help="the model: tiny (~30M, Llama) or a published Qwen2.5 shape with random weights")
    ap.add_argument("--warmup", type=int, default=2, help="optimizer steps left out of the timing")
    ap.add_argument("--gpu", default="H200", help="the planner's GPU on CPU (or for a GPU the catalog lacks)")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent / "src"))
    cuda = args.device == "cuda"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA GPU here")
    if args.child:
        child(args.child, args.work, args.work / args.child, args.seq_len, args.steps, cuda, args.warmup)
        return
    args.work = args.work / f"{args.shape}-{args.device}"
    if not (args.work / "model" / "config.json").exists():
        build_assets(args.work, args.examples, shape=args.shape, device=args.device)
    results = {}
    for name in (args.only.split(",") if args.only else VARIANTS):
        out = args.work / name
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--work", str(args.work),
                               "--seq-len", str(args.seq_len), "--steps", str(args.steps),
                               "--device", args.device, "--warmup", str(args.warmup)], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[name] = json.loads((out / "result.json").read_text())
    import torch

    where = torch.cuda.get_device_name(0) + ", bf16" if cuda else f"CPU ({os.cpu_count()} cores), fp32"
    gpu = torch.cuda.get_device_name(0) if cuda else args.gpu
    for name, r in results.items():
        r["tokens_per_s"], r["timed_steps"] = steady(r, args.warmup)
        r["planner"] = planned(args.work, name, r["batch"], args.seq_len, gpu)
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    base = results.get("trl-sft-packed")
    mem = "peak GPU allocated GiB" if cuda else "peak RSS GB"
    print(f"\n{args.shape} model, {args.examples} examples, seq_len {args.seq_len}, {where}; "
          f"first {args.warmup} steps not timed\n")
    print(f"| variant | optimizer steps (timed) | wall s | non-padding tok/s | ratio vs TRL | {mem} | val loss "
          f"| planner tok/s | planner peak allocated GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        tps = r["tokens_per_s"]
        ratio = tps / base["tokens_per_s"] if base else float("nan")
        peak = r.get("peak_gpu_gib") if cuda else r["peak_rss_gb"]
        plan = r["planner"] or {}
        p_tps = f"{plan['tokens_per_s']:,.0f} ({plan['gpu']})" if "tokens_per_s" in plan else "-"
        p_mem = f"{plan['peak_allocated_gib']:.2f}" if "peak_allocated_gib" in plan else "-"
        print(f"| {name} | {r['steps']} ({r['timed_steps']}) | {r['wall_s']:.1f} | {tps:,.0f} | {ratio:.2f}x | "
              f"{peak:.2f} | {r['val_loss']:.4f} | {p_tps} | {p_mem} |")


if __name__ == "__main__":
    main()
