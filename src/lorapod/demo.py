"""``lorapod demo``: the whole LLM path, offline, on a CPU, in about two minutes.

With no ``--model``, it builds a small Llama-architecture model (random weights) and a byte-level
BPE tokenizer in code, saves them as a normal transformers folder, writes a chat dataset that
teaches one behaviour (answering "what colour is X?" with "The X is Y."), trains a LoRA on it
with the real engine, and shows base vs tuned validation loss and generations. A random base
model obviously lacks the behaviour; the point is that the loop, masking, packing, checkpoints
and the PEFT adapter are the same ones a real job uses.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from lorapod.spec import load_spec

FACTS = {
    "banana": "yellow", "lime": "green", "cherry": "red", "plum": "purple", "orange": "orange",
    "blueberry": "blue", "lemon": "yellow", "grape": "purple", "kiwi": "brown", "coconut": "brown",
    "strawberry": "red", "pear": "green", "apricot": "orange", "fig": "purple", "melon": "green",
    "raspberry": "red", "mango": "orange", "olive": "black", "peach": "pink", "papaya": "orange",
}
TRAIN_QUESTIONS = [
    "What colour is a {x}?",
    "Tell me the colour of a {x}.",
    "Which colour does a {x} have?",
    "I wonder what colour a {x} is.",
    "Quick question: what colour is the {x}?",
]
VAL_QUESTIONS = ["Do you know the colour of a {x}?"]
SYSTEM = "You are a fruit expert. Answer in one short sentence."


def answer(x: str) -> str:
    return f"The {x} is {FACTS[x]}."


def build_dataset(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Training and validation conversations (``messages`` format).

    Validation asks about the same fruits with a phrasing never seen in training, so a falling
    validation loss means the adapter learnt the behaviour, not the strings.
    """
    rng = random.Random(seed)
    fruits = list(FACTS)
    train: list[dict] = []
    for q in TRAIN_QUESTIONS:
        for x in fruits:
            msgs = [{"role": "user", "content": q.format(x=x)}, {"role": "assistant", "content": answer(x)}]
            if rng.random() < 0.5:
                msgs.insert(0, {"role": "system", "content": SYSTEM})
            train.append({"messages": msgs})
    for _ in range(20):  # a few two-turn conversations: masking must label both replies
        a, b = rng.sample(fruits, 2)
        train.append({"messages": [
            {"role": "user", "content": rng.choice(TRAIN_QUESTIONS).format(x=a)},
            {"role": "assistant", "content": answer(a)},
            {"role": "user", "content": rng.choice(TRAIN_QUESTIONS).format(x=b)},
            {"role": "assistant", "content": answer(b)},
        ]})
    rng.shuffle(train)
    val = [{"messages": [{"role": "user", "content": q.format(x=x)}, {"role": "assistant", "content": answer(x)}]}
           for q in VAL_QUESTIONS for x in fruits]
    return train, val


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 600):
    """A byte-level BPE tokenizer trained on ``texts``, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token="<|endoftext|>",
        unk_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    return fast


def build_base_model(out_dir: Path, texts: list[str], seed: int = 0, hidden: int = 128, layers: int = 4) -> Path:
    """Save a small random Llama model + tokenizer as a loadable transformers folder."""
    import torch

    tokenizer = build_tokenizer(texts)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG is left as it was (a training run's seed)
        torch.manual_seed(seed)
        return _build_llama(out_dir, tokenizer, hidden, layers)


def _build_llama(out_dir: Path, tokenizer, hidden: int, layers: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # A random LM head at the usual 0.02 scale caps the logits near +/-3, so even a perfect
    # adapter could not become confident; a wider head lets the LoRA show what it learnt.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def demo_texts(train: list[dict], val: list[dict]) -> list[str]:
    return [m["content"] for r in train + val for m in r["messages"]] + [SYSTEM, "user", "assistant", "system"]


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
    shutil.copy2(run.metrics_file, out / "metrics.jsonl")
    if (run.root / "loss.png").exists():
        shutil.copy2(run.root / "loss.png", out / "loss.png")
    shutil.copy2(run.spec_file, out / "spec.yaml")
    first = (trained.result.first_eval or {}).get("val_loss")
    last = (trained.result.last_eval or {}).get("val_loss")
    return DemoResult(out, first, last, samples)
