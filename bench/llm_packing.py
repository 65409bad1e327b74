"""Packed LLM rows: padding-free attention (the engine's default) against the explicit (B,1,L,L) mask.

The same tiny-but-not-trivial Llama (built in code, random weights, LoRA r=8 on every linear, as
the engine attaches it), the same packed rows (chat-like example lengths, log-normal, packed by the
engine's ``llm_data.pack`` into rows of L tokens), the same optimizer-free forward + backward of the
engine's loss (``_TokenLosses``: label positions only). Two paths per sequence length:

- ``mask``: the recipe before issue 33: SDPA with the boolean block-diagonal causal mask
  (``Batch.attention_mask()``), which SDPA turns into a float copy per layer;
- ``padding-free``: the default now (engine/attention.py): no mask, restarting position ids,
  lorapod's varlen SDPA (each example of a row on its own, ``is_causal=True``).

Reported per length: real tokens per second (padding excluded) and the process's peak RSS during
the steps (VmHWM, reset before each configuration through /proc/self/clear_refs), with the loss of
the first step of each path: the two must print the same loss.

    python bench/llm_packing.py                 # L = 2048, 4096, 8192 (about 1.5 CPU-minutes)
    python bench/llm_packing.py --smoke         # L = 256, 512, one step: the code path in seconds
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def build(hidden: int, layers: int, heads: int, vocab: int, seed: int = 0):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from lorapod.engine import attention

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 8 * 8,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                      max_position_embeddings=16384, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    base = LlamaForCausalLM(cfg)
    base.config.use_cache = False
    attention.register()
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    return model


def rows_for(L: int, n_rows: int, vocab: int, seed: int):
    """Packed rows of about L tokens from chat-like examples (log-normal lengths, 30-2000 tokens)."""
    from lorapod.chat.tokenize import IGNORE, Example
    from lorapod.engine import llm_data

    rng = random.Random(seed)
    examples: list[Example] = []
    while sum(len(e) for e in examples) < L * n_rows * 1.02:
        n = int(min(2000, max(30, rng.lognormvariate(5.6, 0.8))))
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        prompt = n // 3  # the reply is the last two thirds: the targets
        examples.append(Example(ids, [IGNORE] * prompt + ids[prompt:]))
    rows = sorted(llm_data.pack(examples, L), key=lambda r: -r.length)[:n_rows]
    return [llm_data.collate([r], examples, pad_id=0) for r in rows]


def run_path(model, batches, path_name: str, steps: int) -> dict:
    import torch

    from lorapod.engine import attention
    from lorapod.engine.llm import _TokenLosses

    base = model.get_base_model()
    if path_name == "mask":
        base.set_attn_implementation("sdpa")
        path = None
    else:
        base.set_attn_implementation(attention.LORAPOD_SDPA)
        path = attention.AttentionPath("sdpa", False, "bench")
    if path is None:  # the old recipe: SDPA with the boolean (B,1,L,L) mask
        def fwd(b):
            out = base.get_decoder()(input_ids=b.input_ids, position_ids=b.position_ids,
                                     attention_mask=b.attention_mask(), use_cache=False)
            hidden = out.last_hidden_state[:, :-1]
            targets = b.labels[:, 1:]
            where = targets != -100
            return torch.nn.functional.cross_entropy(base.get_output_embeddings()(hidden[where]).float(),
                                                     targets[where], reduction="none")
    else:
        losses = _TokenLosses(base.get_decoder(), base.get_output_embeddings(), None, path)

        def fwd(b):
            return losses(b)[0]

    def step(b) -> float:
        model.zero_grad(set_to_none=True)
        nll = fwd(b)
        (nll.sum() / max(1, nll.numel())).backward()
        return nll.detach().mean().item()

    first = step(batches[0])  # warm-up; its loss is the one compared
    gc.collect()
    peak_ok = _reset_peak()
    rss_before = _rss_mib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    for i in range(steps):
        b = batches[(i + 1) % len(batches)]
        step(b)
        tokens += b.n_real
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _rss_mib("VmHWM") if peak_ok else float("nan")
    return {"loss": first, "tok_s": tokens / dt, "tok_cpu_s": tokens / cpu, "peak_mib": peak,
            "step_mib": peak - rss_before}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="L = 256, 512, one timed step, a smaller model")
    ap.add_argument("--lengths", type=int, nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per configuration (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: CPU time is compute only; idle OpenMP threads spin, and on a "
                    "busy machine their spinning counts as CPU time)")
    args = ap.parse_args(argv)

    import warnings

    import torch

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notices
    threads = max(1, args.threads)
    torch.set_num_threads(threads)
    lengths = args.lengths or ([256, 512] if args.smoke else [2048, 4096, 8192])
    steps = args.steps or (1 if args.smoke else 2)
    dims = dict(hidden=64, layers=2, heads=4, vocab=512) if args.smoke else dict(hidden=128, layers=4, heads=4,
                                                                                  vocab=4096)
    model = build(**dims)
    n_params = sum(p.numel() for p in model.parameters())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {threads} threads, "
          f"load average {load:.1f}; model: Llama {dims}, {n_params / 1e6:.1f}M params, LoRA r=8 all-linear, fp32")
    print("| L | path | loss (first step) | real tok/s | real tok per CPU-s | peak RSS MiB | RSS added by the steps MiB |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for L in lengths:
        batches = rows_for(L, steps + 1, dims["vocab"], seed=L)
        row = {"L": L}
        for name in ("mask", "padding-free"):
            r = run_path(model, batches, name, steps)
            row[name] = r
            print(f"| {L} | {name} | {r['loss']:.5f} | {r['tok_s']:,.0f} | {r['tok_cpu_s']:,.0f} | {r['peak_mib']:,.0f} "
                  f"| {r['step_mib']:,.0f} |", flush=True)
        row["speedup"] = row["padding-free"]["tok_s"] / row["mask"]["tok_s"]
        row["cpu_speedup"] = row["padding-free"]["tok_cpu_s"] / row["mask"]["tok_cpu_s"]
        row["rss_ratio"] = row["padding-free"]["step_mib"] / max(1e-9, row["mask"]["step_mib"])
        results.append(row)
    print()
    print("| L | padding-free / mask: tok/s | tok per CPU-s | RSS added: padding-free / mask | same loss |")
    print("|---|---|---|---|---|")
    for row in results:
        same = abs(row["mask"]["loss"] - row["padding-free"]["loss"]) < 1e-4
        print(f"| {row['L']} | {row['speedup']:.2f}x | {row['cpu_speedup']:.2f}x | {row['rss_ratio']:.2f} "
              f"| {'yes' if same else 'NO'} |")
    return results


if __name__ == "__main__":
    main()
