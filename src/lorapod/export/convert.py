"""``lorapod export FILE.safetensors --to comfyui|diffusers --base MODEL``: convert a LoRA file.

kohya -> diffusers needs the base model's module names (kohya names replace dots with
underscores, which cannot be undone by rule alone): they come from the base's configs, with the
models built on the meta device (no weights are read). Each module's ``alpha / rank`` is folded
into ``lora_B``, so the diffusers file loads at scale 1 exactly as the kohya file did.
diffusers -> kohya reads rank, alpha and rsLoRA from the file's metadata (as diffusers writes it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file

from lorapod.errors import ExportError
from lorapod.export import kohya
from lorapod.export.diffusers import save_diffusers
from lorapod.export.source import output_dir, read_safetensors


def base_modules(family: str, base: str) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Module names per component of the base pipeline, and the denoiser's output sizes."""
    import importlib

    from accelerate import init_empty_weights
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(base)
    except (OSError, ValueError) as exc:
        raise ExportError(f"could not read {base}/model_index.json: {exc}",
                          hint="--base must be the diffusers folder or hub id of the base model") from exc
    lay = kohya.layout(family)
    names: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for comp in lay.components():
        lib, cls_name = index.get(comp, (None, None))
        if not cls_name:
            continue
        cls = getattr(importlib.import_module(lib), cls_name)
        with init_empty_weights():
            if lib == "transformers":
                from transformers import AutoConfig

                model = cls(AutoConfig.from_pretrained(base, subfolder=comp))
            else:
                model = cls.from_config(cls.load_config(base, subfolder=comp))
        names[comp] = [n for n, _ in model.named_modules()]
        if comp == lay.denoiser:
            sizes = {n: m.out_features for n, m in model.named_modules() if hasattr(m, "out_features")}
    return names, sizes


def _diffusers_config(meta: dict[str, str], comp: str) -> tuple[float | None, bool]:
    raw = meta.get("lora_adapter_metadata")
    if not raw:
        return None, False
    cfg = json.loads(raw)
    return cfg.get(f"{comp}.lora_alpha"), bool(cfg.get(f"{comp}.use_rslora"))


def convert_file(path: Path, to: str, family: str, base: str | None, out: Path) -> Path:
    from lorapod.export.inspect import inspect_file

    tensors, meta = read_safetensors(path)
    fmt = inspect_file(path)["format"]
    if family not in kohya.LAYOUTS:
        raise ExportError(f"--family {family} has no kohya layout", hint=f"one of {', '.join(kohya.LAYOUTS)}")
    if to == "comfyui" and fmt == "diffusers":
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            comp, _, rest = key.partition(".")
            parts.setdefault(comp, {})[rest] = value
        alpha, rslora = _diffusers_config(meta, next(iter(parts)))
        if alpha is None:
            raise ExportError(f"{path} has no lora_alpha in its metadata; the trained scale is unknown",
                              hint="convert from the run instead (lorapod export RUN --to comfyui)")
        sizes = base_modules(family, base)[1] if base else None
        dtype = next(iter(tensors.values())).dtype  # keep the file's precision
        result = kohya.to_kohya(parts, family, alpha, rslora, dtype=dtype, out_features=sizes)
        name = path.stem.replace("pytorch_lora_weights", "lora")
        with output_dir(out) as tmp:
            save_file(result, str(tmp / f"{name}.safetensors"), metadata=_kohya_meta(parts, family, alpha, rslora, path))
        return out / f"{name}.safetensors"
    if to == "diffusers" and fmt == "kohya":
        if not base:
            raise ExportError("kohya -> diffusers needs the base model's module names", hint="pass --base MODEL")
        names, _ = base_modules(family, base)
        parts, dropped = kohya.from_kohya(tensors, family, names)
        if dropped:
            raise ExportError(f"{path}: {len(dropped)} module(s) name nothing in {base}, e.g. {dropped[0]}",
                              hint=f"check --family {family} and --base")
        from lorapod.engine.diffusion.families import FAMILIES

        configs = {comp: _unit_config(sd) for comp, sd in parts.items()}
        with output_dir(out) as tmp:
            save_diffusers(tmp, FAMILIES[family]().pipeline_cls(), parts, configs)
        return out / "pytorch_lora_weights.safetensors"
    raise ExportError(f"{path} is a {fmt} file; --to {to} converts kohya -> diffusers or diffusers -> comfyui")


def _kohya_meta(parts, family: str, alpha: float, rslora: bool, source: Path) -> dict[str, str]:
    from lorapod.catalog import families

    ranks = Counter(v.shape[0] for sd in parts.values() for k, v in sd.items() if k.endswith(".lora_A.weight"))
    r = ranks.most_common(1)[0][0]
    return {"ss_network_module": "networks.lora", "ss_network_dim": str(r),
            "ss_network_alpha": str(kohya.trained_scale(alpha, r, rslora) * r),
            "ss_base_model_version": families.facts(family).kohya_base_version,
            "modelspec.architecture": families.facts(family).modelspec_architecture,
            "ss_training_comment": f"converted by lorapod from {source.name}"}


def _unit_config(sd: dict[str, torch.Tensor]) -> dict:
    """A LoRA config at scale 1 for every module (alpha already folded into lora_B)."""
    from peft import LoraConfig

    ranks = {kohya.split_peft_key(k)[0]: v.shape[0] for k, v in sd.items() if k.endswith(".lora_A.weight")}
    r = Counter(ranks.values()).most_common(1)[0][0]
    odd = {m: rk for m, rk in ranks.items() if rk != r}
    cfg = LoraConfig(r=r, lora_alpha=r, target_modules=sorted(ranks), rank_pattern=odd, alpha_pattern=odd).to_dict()
    return json.loads(json.dumps(cfg, default=list))
