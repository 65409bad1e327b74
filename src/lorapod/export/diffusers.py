"""The diffusers/PEFT image LoRA file (``pytorch_lora_weights.safetensors``) that ``pipe.load_lora_weights`` reads.

Written through the pipeline class's own ``save_lora_weights``, so its keys (``unet.`` /
``transformer.``, ``text_encoder.``) and the LoRA config in its metadata (rank, alpha, rslora) are
the ones diffusers' own training scripts write. It is for diffusers and PEFT only: it has no
``.alpha`` keys (ComfyUI would apply scale 1.0) and its SD/SDXL attention names are not ones
ComfyUI maps, which is what the kohya file (``export/kohya.py``) is for; ``lorapod inspect`` shows
both. The engine writes it at the end of training and export re-writes it from a checkpoint, so
this module imports nothing of either.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def save_diffusers(folder, pipeline_cls, parts: dict[str, dict[str, torch.Tensor]], configs: dict[str, dict]) -> None:
    """Through the pipeline class's own ``save_lora_weights`` (keys, prefixes and metadata as diffusers expects)."""
    kwargs: dict = {}
    for comp, sd in parts.items():
        name = comp if comp != "unet" else "unet"
        kwargs[f"{name}_lora_layers"] = sd
        kwargs[f"{name}_lora_adapter_metadata"] = json.loads(json.dumps(configs[comp], default=list))
    pipeline_cls.save_lora_weights(str(folder), safe_serialization=True, **kwargs)
