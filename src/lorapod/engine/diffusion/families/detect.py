"""Which family a base model is, read before anything loads: a folder's model_index.json, a
single .safetensors file's tensor names, or a hub id's index."""

from __future__ import annotations

import json
from pathlib import Path

from lorapod.catalog import families
from lorapod.errors import ModelLoadError


def _single_file_family(path: Path) -> str:
    """Read the tensor names of a .safetensors checkpoint (header only) and name its family."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        keys = set(fh.keys())

    def has(*names: str) -> bool:
        return any(n in keys or f"model.diffusion_model.{n}" in keys for n in names)

    if has("single_stream_modulation.lin.weight"):
        return "flux2"
    if has("double_blocks.0.img_attn.qkv.weight"):
        return "flux1"
    if any(k.startswith("conditioner.embedders.1.") for k in keys):
        return "sdxl"
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        return "sd2"
    if any(k.startswith("cond_stage_model.transformer.") for k in keys) or has("input_blocks.0.0.weight"):
        return "sd15"
    return "unknown"


def detect(model_id: str, revision: str | None = None) -> tuple[str, str]:
    """(family, what was found) for a local folder, a single file or a hub id, before any loading."""
    p = Path(model_id).expanduser()
    if p.is_file():
        if p.suffix != ".safetensors":
            raise ModelLoadError(f"{p} is not a .safetensors file", hint="convert it to .safetensors, or use a diffusers folder")
        fam = _single_file_family(p)
        return fam, f"single-file checkpoint {p.name} ({fam})"
    if p.is_dir():
        index = p / "model_index.json"
        if not index.is_file():
            raise ModelLoadError(f"{p} has no model_index.json: not a diffusers pipeline folder",
                                 hint="point model.id at a diffusers folder, a hub id or a .safetensors file")
        raw = json.loads(index.read_text(encoding="utf-8"))
    else:
        from lorapod.home import hub_unreachable, offline

        # one TCP connect first (lorapod.home): with no network huggingface_hub would retry five
        # times (~30 s, a raw line each) before it tries the cache
        unreachable = None if offline() else hub_unreachable()
        try:
            from huggingface_hub import hf_hub_download

            raw = json.loads(Path(hf_hub_download(model_id, "model_index.json", revision=revision,
                                                  local_files_only=offline() or bool(unreachable))).read_text())
        except Exception as exc:
            if unreachable:
                raise ModelLoadError(f"the Hugging Face hub cannot be reached ({unreachable}) and {model_id}'s "
                                     "model_index.json is not in its cache",
                                     hint="check the network (and HF_ENDPOINT if set), or point model.id at a local "
                                          "diffusers folder or .safetensors file") from exc
            raise ModelLoadError(f"could not read model_index.json of {model_id} ({exc.__class__.__name__}: {exc})",
                                 hint="check the id, your network, and `huggingface-cli login` for gated models") from exc
    cls = raw.get("_class_name", "?")
    if cls in families.FAMILIES["wan21"].pipelines:  # 2.1 or 2.2 (two experts): read from the index
        return families.family_of_index(raw) or "unknown", cls
    return families.family_of_index(raw) or "unknown", f"{cls}"
