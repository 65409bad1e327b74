"""The tiny built-in LLM (``lorapod:tiny-llama``): a small random Llama and a byte-level BPE tokenizer.

Built in code from the fruit-colour conversations below (the tokenizer is trained on their text),
so nothing is downloaded: ``lorapod demo`` trains it on those conversations, the engine's tests
build it at other sizes, and ``builtin.resolve`` builds it once under LORAPOD_HOME for specs that
name ``lorapod:tiny-llama``. Its weights are random; the point is that the loop, masking,
packing, checkpoints and the PEFT adapter are the ones a real job uses.
"""

from __future__ import annotations

import random
from pathlib import Path

from lorapod.chat.template import FALLBACK_CHAT_TEMPLATE

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
    fast.chat_template = FALLBACK_CHAT_TEMPLATE  # ChatML, the one lorapod gives a template-less model
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


def build(folder: Path) -> None:
    """``lorapod:tiny-llama`` (``builtin.MODELS``): the demo's model at its default size, seed 0."""
    train, val = build_dataset()
    build_base_model(folder, demo_texts(train, val))
