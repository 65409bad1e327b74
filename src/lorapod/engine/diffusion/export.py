"""Write a trained image LoRA in the two formats people load.

1. ``pytorch_lora_weights.safetensors``: diffusers/PEFT keys (``unet.``/``transformer.``,
   ``text_encoder.``), with the LoRA config (rank, alpha, rslora) in the file's metadata, as
   diffusers' own training scripts write it; ``pipe.load_lora_weights(folder)`` loads it.
2. ``<name>.safetensors``: kohya keys (``lora_unet_...``, ``lora_te1_...``) with
   ``.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha`` and ``ss_*`` metadata, for ComfyUI,
   Forge and A1111.

The kohya ``.alpha`` is the one number that must be right: loaders scale a LoRA by
``alpha / rank``, so the file stores ``alpha = trained_scale * rank`` (``alpha`` for plain LoRA,
``alpha * sqrt(rank)`` for rsLoRA). Loaded at strength 1.0 the effect is then exactly the
trained effect.

Module names are lorapod.export.kohya's per-family layouts: SD 1.5 / SDXL keep diffusers-layout
UNet names and CLIP names under ``text_model.`` (``lora_te_text_model_encoder_layers_0_...``,
also under transformers 5); Flux uses sd-scripts' layout on the original module names
(``lora_unet_double_blocks_0_img_attn_qkv``), which ComfyUI, Forge and diffusers all load.
File 1 is for diffusers and PEFT only: it has no ``.alpha`` keys (ComfyUI would apply scale 1.0)
and its SD/SDXL attention names are not ones ComfyUI maps. ``lorapod inspect`` shows both.
"""

from __future__ import annotations

import json
import time

import torch
from safetensors.torch import save_file

from lorapod.catalog import families
from lorapod.export import kohya
from lorapod.export.kohya import trained_scale


def to_kohya(parts: dict[str, dict[str, torch.Tensor]], family: str, alpha: float, rslora: bool,
             dtype: torch.dtype = torch.float16, out_features: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """``parts`` maps a component ('unet', 'text_encoder', ...) to its PEFT state dict (no prefix)."""
    return kohya.to_kohya(parts, family, alpha, rslora, dtype, out_features)


def tag_frequency(captions_by_folder: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """sd-scripts' ``ss_tag_frequency``: per dataset folder, how often each comma-separated tag
    occurs (A1111 and model sites show the top tags, the trigger first, as the LoRA's keywords)."""
    out: dict[str, dict[str, int]] = {}
    for folder, caps in captions_by_folder.items():
        freq: dict[str, int] = {}
        for cap in caps:
            for tag in (t.strip() for t in cap.split(",")):
                if tag:
                    freq[tag] = freq.get(tag, 0) + 1
        out[folder] = freq
    return out


def kohya_metadata(spec, family: str, prediction_type: str, n_images: int, steps: int, epochs: int,
                   tags: dict[str, dict[str, int]] | None = None) -> dict[str, str]:
    m = spec.method
    return {
        "ss_tag_frequency": json.dumps(tags or {}, ensure_ascii=False),
        "ss_network_module": "networks.lora",
        "ss_network_dim": str(m.r),
        "ss_network_alpha": str(trained_scale(m.alpha, m.r, m.rslora) * m.r),
        "ss_base_model_version": families.facts(family).kohya_base_version,
        "ss_v2": "False",
        "ss_v_parameterization": str(prediction_type == "v_prediction"),
        "ss_sd_model_name": str(spec.model.id),
        "ss_output_name": spec.output.name or "lora",
        "ss_resolution": str((spec.data.resolution, spec.data.resolution)),
        "ss_num_train_images": str(n_images),
        "ss_num_epochs": str(epochs),
        "ss_steps": str(steps),
        "ss_learning_rate": str(spec.train.learning_rate),
        "ss_lr_scheduler": spec.train.scheduler,
        "ss_seed": str(spec.train.seed),
        "ss_noise_offset": str(spec.train.noise_offset),
        "ss_min_snr_gamma": str(spec.train.min_snr_gamma),
        "ss_network_train_unet_only": str(not m.train_text_encoder),
        "ss_training_finished_at": str(int(time.time())),
        "ss_training_comment": f"trained with lorapod; rank {m.r}, trained alpha {m.alpha}{' (rsLoRA)' if m.rslora else ''}",
        "modelspec.architecture": families.facts(family).modelspec_architecture,
        "modelspec.implementation": "https://github.com/kohya-ss/sd-scripts",
        "modelspec.title": spec.output.name or "lora",
    }


def save_kohya(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    save_file(tensors, str(path), metadata=metadata)


def save_diffusers(folder, pipeline_cls, parts: dict[str, dict[str, torch.Tensor]], configs: dict[str, dict]) -> None:
    """Through the pipeline class's own ``save_lora_weights`` (keys, prefixes and metadata as diffusers expects)."""
    kwargs: dict = {}
    for comp, sd in parts.items():
        name = comp if comp != "unet" else "unet"
        kwargs[f"{name}_lora_layers"] = sd
        kwargs[f"{name}_lora_adapter_metadata"] = json.loads(json.dumps(configs[comp], default=list))
    pipeline_cls.save_lora_weights(str(folder), safe_serialization=True, **kwargs)
