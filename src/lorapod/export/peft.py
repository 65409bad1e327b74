"""An LLM checkpoint as a standard PEFT adapter folder (``PeftModel.from_pretrained`` loads it).

A checkpoint holds only the LoRA tensors (``get_peft_model_state_dict`` keys, the same keys
``save_pretrained`` writes), so the folder is those tensors plus an ``adapter_config.json`` built
from the run's spec; the target modules are read from the tensors themselves, so ``all-linear``
becomes the list of layers that were actually trained.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from lorapod.export.kohya import split_peft_key


def target_modules(state: dict[str, torch.Tensor]) -> list[str]:
    return sorted({split_peft_key(k)[0].rsplit(".", 1)[-1] for k in state})


def lora_config(spec, state: dict[str, torch.Tensor], base: str | None = None):
    from peft import LoraConfig

    m = spec.method
    return LoraConfig(r=m.r, lora_alpha=m.alpha, lora_dropout=m.dropout, use_rslora=m.rslora, bias="none",
                      task_type="CAUSAL_LM", target_modules=target_modules(state),
                      base_model_name_or_path=base or str(spec.model.id), revision=spec.model.revision)


def write_peft(spec, state: dict[str, torch.Tensor], out: Path, base: str | None = None) -> Path:
    """``out``/adapter_model.safetensors + adapter_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    cfg = lora_config(spec, state, base).to_dict()
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, default=list), encoding="utf-8")
    return out
