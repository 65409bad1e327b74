"""Packing without the L x L mask (engine/attention.py): every attention path that runs on a CPU
gives the same losses and gradients as the explicit block-diagonal mask, no example sees another,
nothing (L x L) is kept for the backward on the default path, sliding windows are applied, and a
model without sdpa (Gemma 2) loads and trains. Tiny models built in code, CPU, no downloads."""

from __future__ import annotations

import shutil

import pytest
import torch

from lorapod.chat.tokenize import IGNORE, Example
from lorapod.engine import attention, llm_data
from lorapod.errors import HardwareError, LorapodError, SpecError

torch.set_num_threads(1)


def _examples(vocab: int, lengths: list[int], seed: int = 0) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        labels = [IGNORE, *ids[1:]]  # the first token of an example is never a target
        out.append(Example(ids, labels))
    return out


def _batch(vocab: int = 96, lengths=((9, 14, 5), (20, 6)), pad_multiple: int = 8, seed: int = 0):
    flat = [n for row in lengths for n in row]
    examples = _examples(vocab, flat, seed)
    rows, i = [], 0
    for row in lengths:
        rows.append(llm_data.Row(list(range(i, i + len(row))), sum(row)))
        i += len(row)
    return llm_data.collate(rows, examples, pad_id=0, pad_to_multiple=pad_multiple), examples, rows


def _llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw)
    return LlamaForCausalLM(cfg).eval()


def _mistral(window: int):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        sliding_window=window)
    return MistralForCausalLM(cfg).eval()


def _qwen2(window: int):
    """Qwen2 with use_sliding_window: the layers from max_window_layers on are sliding (here the second)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      use_sliding_window=True, sliding_window=window, max_window_layers=1)
    return Qwen2ForCausalLM(cfg).eval()


# the paths: (transformers attn_implementation, what the decoder gets)
OLD = ("sdpa", "bool")  # the recipe before: SDPA with lorapod's boolean (B,1,L,L) mask
LORAPOD = (attention.LORAPOD_SDPA, None)  # the default now: varlen SDPA, no mask
HF_SDPA = ("sdpa", None)  # transformers' own padding-free sdpa (builds a dense mask itself)
EAGER_ADD = ("eager", "additive")  # eager with lorapod's additive mask (remote-code models)
EAGER_PF = ("eager", None)  # eager padding-free (transformers' additive eager_mask)


def _run(model, batch, path, *, grad: bool = True):
    """Per-target NLL and the gradients of every parameter, on ``path``."""
    attention.register()
    impl, mask = path
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    am = {"bool": batch.attention_mask(), "additive": attention.additive_mask(batch.segment_ids, torch.float32),
          None: None}[mask]
    with torch.set_grad_enabled(grad):
        out = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=am,
                          use_cache=False)
        hidden = out.last_hidden_state[:, :-1]
        targets = batch.labels[:, 1:]
        where = targets != IGNORE
        nll = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), targets[where], reduction="none")
        if grad:
            nll.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return nll.detach(), grads, out.last_hidden_state.detach()


@pytest.mark.parametrize("path", [LORAPOD, HF_SDPA, EAGER_ADD, EAGER_PF], ids=lambda p: f"{p[0]}-{p[1]}")
def test_paths_equal_losses_and_gradients(path):
    model = _llama()
    batch, _, _ = _batch()
    ref_nll, ref_grads, _ = _run(model, batch, OLD)
    nll, grads, _ = _run(model, batch, path)
    assert torch.allclose(nll, ref_nll, atol=1e-5, rtol=1e-5)
    assert set(grads) == set(ref_grads) and len(grads) > 10
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


def test_flattened_batch_for_flash_gives_the_same_losses():
    """FlashAttention's varlen path runs the micro-batch as one row without padding (prepare_batch)."""
    model = _llama()
    batch, _, _ = _batch()
    flat = batch.flattened()
    assert flat.input_ids.shape == (1, batch.n_real) and flat.n_labels == batch.n_labels
    flash = attention.AttentionPath("flash", False, "t")
    assert attention.prepare_batch(batch, flash).input_ids.shape == (1, batch.n_real)
    one, _, _ = _batch(lengths=((9, 14),))  # one row, padded to 24: the padding goes too
    assert attention.prepare_batch(one, flash).input_ids.shape == (1, 23)
    assert attention.prepare_batch(batch, attention.AttentionPath("sdpa", False, "t")) is batch
    nll, grads, _ = _run(model, batch, LORAPOD)
    nll_flat, grads_flat, _ = _run(model, flat, LORAPOD)
    assert torch.allclose(nll, nll_flat, atol=1e-5)
    for name in grads:
        assert torch.allclose(grads[name], grads_flat[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("path", [LORAPOD, EAGER_PF], ids=lambda p: p[0])
def test_no_example_sees_another(path):
    """Changing the tokens of the second example of a packed row leaves the first one's outputs as
    they were, and changes its own."""
    model = _llama()
    batch, examples, rows = _batch()
    _, _, h = _run(model, batch, path, grad=False)
    first, second = len(examples[0]), len(examples[1])
    perturbed = llm_data.collate(rows, examples, 0, 8)
    perturbed.input_ids[0, first:first + second] = (perturbed.input_ids[0, first:first + second] + 7) % 90 + 3
    _, _, h2 = _run(model, perturbed, path, grad=False)
    assert torch.equal(h[0, :first], h2[0, :first])
    assert torch.equal(h[0, first + second:], h2[0, first + second:])  # the third example and the padding
    assert not torch.allclose(h[0, first:first + second], h2[0, first:first + second])
    assert torch.equal(h[1], h2[1])


def test_padding_free_keeps_no_sequence_by_sequence_tensor_for_backward(tmp_path):
    """The recipe's own forward, as training runs it: with the default path nothing (L, L) is saved
    for the backward; with the explicit mask (the old recipe) one float copy per layer is."""
    from lorapod.engine.llm import prepare
    from lorapod.spec import load_spec

    from .llm_fixtures import make_model_dir, spec_dict, write_data

    model_dir = make_model_dir(tmp_path)
    train, val = write_data(tmp_path)
    spec = load_spec(raw=spec_dict(model_dir, train, val, tmp_path / "runs"))
    recipe, _stats, _fb = prepare(spec, device="cpu", log=lambda *_: None)
    assert recipe.attention.padding_free and recipe.attention.kernel == "sdpa"
    batch = recipe.epoch_batches(0)[0]
    L = batch.input_ids.shape[1]
    assert any(len(set(s.tolist()) - {-1}) > 1 for s in batch.segment_ids)  # a packed row

    def square(losses) -> list[tuple]:
        seen = []

        def pack(t):
            if t.dim() >= 2 and t.shape[-1] == L and t.shape[-2] == L:
                seen.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            nll, _ = losses(batch)
        nll.sum().backward()
        return seen

    assert square(recipe.losses) == []
    old = type(recipe.losses)(recipe.decoder, recipe.head, recipe.softcap,
                              attention.AttentionPath("sdpa", True, "explicit"), torch.float32)
    assert len(square(old)) >= 2  # the probe can see them: one per layer with the mask


@pytest.mark.parametrize("make", [_mistral, _qwen2], ids=["mistral", "qwen2"])
def test_sliding_windows_are_applied(make):
    """A 4-token window (Mistral: every layer; Qwen2: its sliding layers): lorapod's varlen SDPA
    equals transformers' eager path (which builds the windowed document mask itself), and differs
    from the explicit mask, which ignores windows (review G22)."""
    model = make(window=4)
    batch, _, _ = _batch()
    pf, grads, _ = _run(model, batch, LORAPOD)
    ref, ref_grads, _ = _run(model, batch, EAGER_PF)
    assert torch.allclose(pf, ref, atol=1e-5)
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name
    old, _, _ = _run(model, batch, OLD)
    assert not torch.allclose(pf, old, atol=1e-3)
    wide = make(window=64)  # a window longer than every example: the same as no window
    assert torch.allclose(_run(wide, batch, LORAPOD)[0], _run(wide, batch, OLD)[0], atol=1e-5)


def test_generation_runs_through_the_standard_sdpa():
    """The varlen function hands anything but the padding-free training call (a cache, one query
    at a time) to transformers' sdpa: greedy generation matches."""
    model = _llama()
    ids = torch.randint(3, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("sdpa")
    ref = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    attention.register()
    model.set_attn_implementation(attention.LORAPOD_SDPA)
    assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0), ref)


# ----------------------------------------------------------------------------- choice


class _Remote(torch.nn.Module):  # a model class from a hub repo's own code
    _supports_sdpa = True
    _supports_flex_attn = True


_Remote.__module__ = "transformers_modules.someone.model"


def test_auto_picks_per_model_and_device():
    from transformers import Gemma2ForCausalLM, LlamaForCausalLM

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    p = attention.choose("auto", LlamaForCausalLM, cpu, flash=True, flex=True)
    assert (p.kernel, p.explicit_mask, p.hf_name, p.pad_multiple(cpu)) == ("sdpa", False, "lorapod_sdpa", 1)
    assert attention.choose("auto", LlamaForCausalLM, cuda, flash=True).kernel == "flash"
    assert attention.choose("auto", LlamaForCausalLM, cuda, flash=False).kernel == "sdpa"
    assert attention.choose("auto", LlamaForCausalLM, cuda, flash=False).pad_multiple(cuda) == 8
    gemma = attention.choose("auto", Gemma2ForCausalLM, cpu)
    assert (gemma.kernel, gemma.explicit_mask, gemma.hf_name) == ("eager", False, "eager")
    assert attention.choose("auto", Gemma2ForCausalLM, cuda, flash=False, flex=True).kernel == "flex"
    remote = attention.choose("auto", _Remote, cuda, flash=True)
    assert (remote.kernel, remote.explicit_mask, remote.pad_multiple(cuda)) == ("sdpa", True, 64)
    assert attention.choose("flex", LlamaForCausalLM, cuda, flex=True).hf_name == "flex_attention"


def test_explicit_choices_the_model_or_machine_cannot_run_are_refused():
    from transformers import Gemma2ForCausalLM, LlamaForCausalLM

    with pytest.raises(SpecError, match=r"does not support train\.attention sdpa"):
        attention.choose("sdpa", Gemma2ForCausalLM, torch.device("cpu"))
    with pytest.raises(HardwareError, match="CUDA GPUs only"):
        attention.choose("flash", LlamaForCausalLM, torch.device("cpu"), flash=True)
    with pytest.raises(HardwareError, match="CUDA GPUs only"):
        attention.choose("flex", LlamaForCausalLM, torch.device("cpu"))
    with pytest.raises(HardwareError, match="flash_attn"):
        attention.choose("flash", LlamaForCausalLM, torch.device("cuda"), flash=False)
    with pytest.raises(SpecError, match="remote code"):
        attention.choose("flex", _Remote, torch.device("cuda"), flex=True)


def test_spec_knob_is_validated():
    from lorapod.spec import validate

    base = {"model": {"id": "x", "family": "llm"}, "data": {"path": "d.jsonl"}}
    assert validate(base).train.attention == "auto"
    assert validate({**base, "train": {"attention": "flex"}}).train.attention == "flex"
    with pytest.raises(SpecError, match=r"train.attention = 'flash3'.*allowed: auto \| sdpa \| flex \| flash \| eager"):
        validate({**base, "train": {"attention": "flash3"}})
    with pytest.raises(SpecError, match="is for the LLM recipe"):
        validate({"model": {"id": "x", "family": "sdxl"}, "data": {"path": "imgs"}, "train": {"attention": "eager"}})


# ----------------------------------------------------------------------------- Gemma 2 (review G7)


def _gemma2_dir(tmp_path):
    """A tiny Gemma 2 (soft-capping, sliding windows, no sdpa) with the demo's tokenizer."""
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

    from .llm_fixtures import make_model_dir

    llama = make_model_dir(tmp_path / "llama", hidden=32, layers=1)
    tok = AutoTokenizer.from_pretrained(str(llama))
    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                       max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    out = tmp_path / "gemma2"
    Gemma2ForCausalLM(cfg).save_pretrained(str(out))
    for f in llama.iterdir():
        if ("token" in f.name or f.name.endswith((".jinja", ".txt"))) and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def test_gemma2_loads_and_trains(tmp_path):
    """Gemma 2 declares no sdpa: the recipe used to force sdpa and report the refusal as "not in
    the cache". Now auto runs it on eager, padding-free, and a step lowers nothing to NaN."""
    from lorapod.engine.llm import prepare
    from lorapod.spec import load_spec

    from .llm_fixtures import spec_dict, write_data

    model_dir = _gemma2_dir(tmp_path)
    train, val = write_data(tmp_path)
    spec = load_spec(raw=spec_dict(model_dir, train, val, tmp_path / "runs"))
    recipe, _stats, _fb = prepare(spec, device="cpu", log=lambda *_: None)
    assert (recipe.attention.kernel, recipe.attention.padding_free) == ("eager", True)
    recipe.train()
    batch = recipe.epoch_batches(0)[0]
    out = recipe.loss(batch)
    out.loss_sum.backward()
    grads = [p.grad for p in recipe.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_gemma2_with_sdpa_is_a_spec_error_not_a_cache_error(tmp_path):
    from lorapod.engine.llm import prepare
    from lorapod.spec import load_spec

    from .llm_fixtures import spec_dict, write_data

    model_dir = _gemma2_dir(tmp_path)
    train, val = write_data(tmp_path)
    spec = load_spec(raw=spec_dict(model_dir, train, val, tmp_path / "runs", attention="sdpa"))
    with pytest.raises(LorapodError) as err:
        prepare(spec, device="cpu", log=lambda *_: None)
    assert isinstance(err.value, SpecError)
    assert "cache" not in str(err.value) and "train.attention sdpa" in str(err.value)


def test_flash_on_a_cpu_is_refused_before_the_model_loads(tmp_path):
    from lorapod.engine.device import resolve_precision
    from lorapod.engine.llm_model import load_model
    from lorapod.spec import load_spec

    from .llm_fixtures import spec_dict, write_data

    train, val = write_data(tmp_path)
    spec = load_spec(raw=spec_dict(tmp_path / "no-such-model", train, val, tmp_path / "runs", attention="flash"))
    precision = resolve_precision("auto", "auto", torch.device("cpu"))
    with pytest.raises(HardwareError, match="CUDA GPUs only"):  # not "model folder does not exist"
        load_model(spec, precision)
