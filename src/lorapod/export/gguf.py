"""llama.cpp files, written with the ``gguf`` package (the one llama.cpp's own converters use).

Adapter (what ``convert_lora_to_gguf.py`` writes, and ``llama-cli --lora`` / Ollama ``ADAPTER`` read):
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per LoRA'd weight
``<llama.cpp tensor name>.lora_a`` (r x in) and ``.lora_b`` (out x r). llama.cpp scales by
``alpha / rank``, so rsLoRA's ``alpha / sqrt(r)`` is written as ``alpha * sqrt(r)``. Llama's q and
k weights are stored with llama.cpp's rotary row permutation, so their ``lora_b`` rows get the same
permutation (``lora_a`` is unchanged). Like llama.cpp, full weights in an adapter (embeddings or
lm_head saved whole, new tokens) are refused: llama.cpp cannot apply them.

Model (merged, or a base for Ollama's ``ADAPTER``): the transformers folder as a llama.cpp model,
for the architectures below, with the tokenizer's vocabulary, merges, special ids and chat template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lorapod.errors import DependencyError, ExportError
from lorapod.export.kohya import split_peft_key


@dataclass(frozen=True)
class Arch:
    name: str  # llama.cpp architecture
    permute_qk: bool  # llama.cpp reorders q/k rows for rotary embeddings (Llama's converter does)


ARCHS = {
    "LlamaForCausalLM": Arch("llama", True),
    "MistralForCausalLM": Arch("llama", True),
    "Qwen2ForCausalLM": Arch("qwen2", False),
    "Qwen3ForCausalLM": Arch("qwen3", False),
}


def _gguf():
    try:
        import gguf
    except ImportError as exc:
        raise DependencyError("writing GGUF needs the gguf package", hint='pip install "lorapod[export]"') from exc
    return gguf


def arch_of(config) -> Arch:
    name = (getattr(config, "architectures", None) or ["?"])[0]
    if name not in ARCHS:
        raise ExportError(f"GGUF export supports {', '.join(ARCHS)}; this base is a {name}",
                          hint="export --to merged and convert with llama.cpp's convert_hf_to_gguf.py")
    return ARCHS[name]


def permute(w: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    """llama.cpp's rotary layout for Llama q/k rows (per head: interleaved halves -> pairs)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _qk_permute(hf_name: str, w: torch.Tensor, config, arch: Arch) -> torch.Tensor:
    if not arch.permute_qk:
        return w
    if hf_name.endswith("self_attn.q_proj.weight"):
        return permute(w, config.num_attention_heads, config.num_attention_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return permute(w, config.num_attention_heads, config.num_key_value_heads)
    return w


def _name_map(config, arch: Arch):
    gguf = _gguf()
    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch.name)
    return gguf.get_tensor_name_map(enum, config.num_hidden_layers)


def hf_name(peft_module: str) -> str:
    """'base_model.model.model.layers.0.self_attn.q_proj' -> 'model.layers.0.self_attn.q_proj.weight'."""
    return peft_module.removeprefix("base_model.model.") + ".weight"


def adapter_tensors(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """PEFT LoRA tensors -> {llama.cpp name + '.lora_a'/'.lora_b': tensor}."""
    arch = arch_of(config)
    names = _name_map(config, arch)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." not in key and ".lora_B." not in key:
            raise ExportError(f"the adapter holds a full weight {key}, which llama.cpp cannot apply as a LoRA "
                              "(embeddings or lm_head saved whole, e.g. after adding tokens)",
                              hint="retrain without modules_to_save / new tokens, or export --to merged")
        module, kind = split_peft_key(key)
        hf = hf_name(module)
        target = names.get_name(hf, try_suffixes=(".weight",))
        if target is None:
            raise ExportError(f"llama.cpp has no tensor for {hf}", hint="export --to merged instead")
        t = value.float()
        if kind == "up":
            t = _qk_permute(hf, t, config, arch)
        out[f"{target}.lora_{'a' if kind == 'down' else 'b'}"] = t
    return out


def write_adapter(state: dict[str, torch.Tensor], config, alpha: float, rslora: bool, path: Path,
                  name: str = "lora") -> Path:
    gguf = _gguf()
    arch = arch_of(config)
    tensors = adapter_tensors(state, config)
    rank = next(v for k, v in tensors.items() if k.endswith(".lora_a")).shape[0]
    w = gguf.GGUFWriter(str(path), arch.name)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(name)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha * math.sqrt(rank) if rslora else alpha))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, t in tensors.items():
        w.add_tensor(key, t.numpy().astype(np.float32))
    _finish(w)
    return path


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def write_model(model_dir: Path, path: Path, outtype: str = "f16") -> Path:
    """A transformers folder (Llama / Mistral / Qwen2 / Qwen3) as a llama.cpp GGUF model."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    gguf = _gguf()
    config = AutoConfig.from_pretrained(str(model_dir))
    arch = arch_of(config)
    names = _name_map(config, arch)
    w = gguf.GGUFWriter(str(path), arch.name)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(Path(model_dir).name)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(config.vocab_size)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(_rope_theta(config))
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}[outtype])
    _add_vocab(w, gguf, AutoTokenizer.from_pretrained(str(model_dir)), model_dir, config)
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no .safetensors weights", hint="export --to merged writes them")
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                target = names.get_name(key, try_suffixes=(".weight", ".bias"))
                if target is None:
                    raise ExportError(f"{f}: llama.cpp has no tensor for {key}")
                t = _qk_permute(key, fh.get_tensor(key).float(), config, arch)
                half = outtype == "f16" and t.ndim == 2  # llama.cpp keeps norms and biases in f32
                w.add_tensor(target, t.numpy().astype(np.float16 if half else np.float32))
    _finish(w)
    return path


def _add_vocab(w, gguf, tok, model_dir: Path, config) -> None:
    """Byte-level BPE vocabulary as llama.cpp's 'gpt2' tokenizer model, specials marked as control."""
    vocab = tok.get_vocab()
    n = max(config.vocab_size, max(vocab.values()) + 1)
    by_id = {i: t for t, i in vocab.items()}
    special = set(tok.all_special_ids)
    added = {i for i in getattr(tok, "added_tokens_decoder", {})}
    tokens, types = [], []
    for i in range(n):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        if i not in by_id:
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(str(model_dir), load_merges=True, n_vocab=n).add_to_gguf(w)


# ----------------------------------------------------------------------------- reading


def read(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Metadata and tensors of a GGUF file (tensors as stored: numpy, in the writer's shape)."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise ExportError(f"{path} is not a readable GGUF file ({exc})", hint="it may be truncated") from exc
    kv: dict[str, object] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            kv[name] = field.contents()
        except (ValueError, IndexError, TypeError):
            kv[name] = None
    tensors = {t.name: np.array(t.data).reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
    return kv, tensors
