"""The planner counts the attention path lorapod's engine runs (issue 33 item 4, review G9):
padding-free rows keep nothing L x L and cost causal FLOPs; an explicit mask is one B x L^2 tensor
in the compute dtype and costs the full L^2; eager keeps each layer's L x L probabilities. The
memory terms are checked against what autograd really keeps, counted with saved-tensor hooks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lorapod.catalog.models import LLMArch, find_model
from lorapod.plan.vram import GiB, Settings, attention_square_bytes, estimate
from lorapod.plan.work import step_work
from lorapod.spec import load_spec


def _settings(**kw) -> Settings:
    base = {"base_dtype": "bf16", "r": 16, "targets": "all-linear", "optimizer": "adamw",
            "gradient_checkpointing": False, "batch": 1, "seq_len": 8192}
    return Settings(**{**base, **kw})


QWEN7B = LLMArch("qwen2.5-7b-shaped", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                 intermediate=18944, vocab=152064, tied=False)


def test_padding_free_has_no_square_term():
    s = _settings()
    parts = estimate(QWEN7B, s).parts
    assert not any("L x L" in k for k in parts)
    assert attention_square_bytes(QWEN7B, s) == 0.0


def test_explicit_mask_is_one_bf16_copy_with_or_without_checkpointing():
    for gc in (False, True):
        s = _settings(attention="mask", gradient_checkpointing=gc, batch=2)
        parts = estimate(QWEN7B, s).parts
        assert parts["attention (L x L, mask)"] == pytest.approx(2 * 8192**2 * 2 / GiB)  # 0.25 GiB
        total = estimate(QWEN7B, s).peak_gb
        assert total > estimate(QWEN7B, replace(s, attention="padding_free")).peak_gb


def test_eager_keeps_the_probabilities_of_every_layer_without_checkpointing():
    s = _settings(attention="eager", seq_len=2048)
    per_layer = 28 * 2048**2 * 6  # heads x L^2 x (fp32 softmax output + its bf16 copy)
    mask = 2048**2 * 2
    assert attention_square_bytes(QWEN7B, s) == 28 * per_layer + mask
    assert attention_square_bytes(QWEN7B, replace(s, gradient_checkpointing=True)) == per_layer + mask
    with pytest.raises(ValueError, match="unknown attention path"):
        attention_square_bytes(QWEN7B, replace(s, attention="bool"))


def test_flops_full_square_with_a_mask_causal_without():
    s = _settings(seq_len=4096)
    free = step_work(QWEN7B, s)
    for path in ("mask", "eager"):
        full = step_work(QWEN7B, replace(s, attention=path))
        assert full.attention_tflops == pytest.approx(2 * free.attention_tflops)
        assert full.matmul_tflops == free.matmul_tflops
    # causal over the row: 2 x layers x heads x head_dim x L^2 per forward (half of 4 L^2 d)
    forwards = 1 + 2.5
    assert free.attention_tflops * 1e12 == pytest.approx(2 * 28 * 28 * 128 * 4096**2 * forwards)


def test_settings_from_spec_name_the_engines_path(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    arch = find_model("qwen2.5-0.5b")

    def path(model: dict, train: dict) -> str:
        spec = load_spec(raw={"model": {"id": "qwen2.5-0.5b", "family": "llm", **model},
                              "data": {"path": str(data)}, "train": train})
        return Settings.from_spec(spec, arch).attention

    assert path({}, {}) == "padding_free"
    assert path({}, {"attention": "flex"}) == "padding_free"
    assert path({}, {"attention": "eager"}) == "eager"
    assert path({"trust_remote_code": True}, {}) == "mask"


@pytest.mark.parametrize("path", ["padding_free", "mask", "eager"])
def test_square_bytes_equal_what_autograd_keeps(path):
    """A tiny bf16 Llama, one packed row, the engine's forward kwargs on each path: the L x L bytes
    saved for the backward (hooks), plus the mask the step holds, are the planner's term."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lorapod.chat.tokenize import Example
    from lorapod.engine import attention, llm_data

    torch.manual_seed(0)
    layers, heads, L = 3, 4, 96  # L differs from every other size of the model
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    kernel = {"padding_free": "sdpa", "mask": "sdpa", "eager": "eager"}[path]
    engine_path = attention.AttentionPath(kernel, path == "mask", "test")
    attention.install(model, engine_path)
    examples = [Example([3 + i % 60 for i in range(n)], [3 + i % 60 for i in range(n)]) for n in (50, 30)]
    batch = llm_data.collate([llm_data.Row([0, 1], 80)], examples, 0, 32)
    assert batch.input_ids.shape[1] == L
    kept: dict[int, int] = {}

    def pack(t):
        if t.dim() >= 2 and t.shape[-2:] == (L, L):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    kwargs = attention.forward_kwargs(batch, engine_path, torch.bfloat16)
    held = 0
    if kwargs["attention_mask"] is not None:
        held = kwargs["attention_mask"].numel() * kwargs["attention_mask"].element_size()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.model(input_ids=batch.input_ids, use_cache=False, **kwargs)
    out.last_hidden_state.float().sum().backward()
    measured = sum(kept.values())
    if path == "mask":  # the one mask, kept once for all layers
        assert measured == held
    if path == "eager":  # transformers builds its own additive mask: held by the step, not saved
        measured += L * L * 2
    arch = LLMArch("tiny", hidden=32, layers=layers, heads=heads, kv_heads=2, head_dim=8, intermediate=64,
                   vocab=64, tied=False)
    s = _settings(seq_len=L, attention=path)
    assert measured == attention_square_bytes(arch, s)
