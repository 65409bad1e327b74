"""Image-run exports: the ComfyUI/Forge/A1111 (kohya) file, the diffusers file, and a merged pipeline.

They are made from the checkpoint's PEFT tensors (``unet.`` / ``transformer.`` / ``text_encoder.``
keys), so re-exporting an older run also gets today's names.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from lorapod.errors import ExportError
from lorapod.export import kohya
from lorapod.export.diffusers import save_diffusers
from lorapod.export.kohya import split_peft_key, trained_scale
from lorapod.export.source import Source, read_safetensors

COMPONENTS = ("unet", "transformer", "transformer_2", "text_encoder", "text_encoder_2")


def parts_of(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        comp, _, rest = key.partition(".")
        if comp not in COMPONENTS:
            raise ExportError(f"unexpected key {key} in an image adapter", hint=f"keys start with one of {COMPONENTS}")
        parts.setdefault(comp, {})[rest] = value
    return parts


def family_of(src: Source):
    """The run's family as its spec names it (the engine trained that one); only ``auto`` is
    detected from the base model."""
    from lorapod.engine.diffusion.families import FAMILIES, resolve_family

    named = src.spec.model.family
    if named in FAMILIES:
        return FAMILIES[named]()
    return resolve_family(named, src.spec.model.id, src.spec.model.revision)


def write_comfyui(src: Source, out: Path) -> Path:
    """The kohya file(s) (``kohya.files_of``: one per Wan 2.2 expert, named as the engine names
    them); returns the first."""
    fam = family_of(src)
    m = src.spec.method
    sizes = None
    # a fused layer (q, k, v -> qkv) with an untrained part needs the part's size
    if any(parts > 1 for *_, parts in kohya.layout(fam.name).rules):
        from lorapod.export.convert import base_modules

        sizes = base_modules(fam.name, str(src.spec.model.id))[1]
    parts = parts_of(src.state())
    two = fam.separate_expert_files(set(parts), src.spec.train.experts)
    name = src.spec.output.name or "lora"
    paths = []
    for suffix, file_parts in kohya.files_of(parts, two).items():
        tensors = kohya.to_kohya(file_parts, fam.name, m.alpha, m.rslora, out_features=sizes)
        engine_file = src.run.root / "exports" / src.label / f"{name}{suffix}.safetensors"
        if engine_file.is_file():  # the metadata the engine wrote at that step (tags, counts)
            meta = read_safetensors(engine_file)[1]
        else:
            meta = kohya.kohya_metadata(src.spec, fam.name, _prediction(src), 0, src.step or 0, 0)
        meta["ss_network_alpha"] = str(trained_scale(m.alpha, m.r, m.rslora) * m.r)
        paths.append(out / f"{name}{suffix}.safetensors")
        save_file(tensors, str(paths[-1]), metadata=meta)
    return paths[0]


def _prediction(src: Source) -> str:
    import json

    cfg = Path(str(src.spec.model.id)) / "scheduler" / "scheduler_config.json"
    if cfg.is_file():
        return json.loads(cfg.read_text()).get("prediction_type", "epsilon")
    return "epsilon"


def peft_configs(src: Source, parts: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict]:
    from peft import LoraConfig

    m = src.spec.method
    out = {}
    for comp, sd in parts.items():
        targets = sorted({split_peft_key(k)[0] for k in sd})
        out[comp] = LoraConfig(r=m.r, lora_alpha=m.alpha, use_rslora=m.rslora, target_modules=targets).to_dict()
    return out


def write_diffusers(src: Source, out: Path) -> Path:
    import json

    fam = family_of(src)
    parts = parts_of(src.state())
    configs = json.loads(json.dumps(peft_configs(src, parts), default=list))
    save_diffusers(out, fam.lora_file_writer(), parts, configs)
    return out / "pytorch_lora_weights.safetensors"


@torch.no_grad()
def merge_pipeline(src: Source, out: Path, base: str | None = None) -> dict[str, float]:
    """LoRA fused into the base pipeline (its dtype), checked weight by weight against base + adapter."""
    import tempfile

    fam = family_of(src)
    model_id = base or str(src.spec.model.id)
    m = src.spec.method
    parts = parts_of(src.state())
    try:
        pipe = fam.pipeline_cls().from_pretrained(model_id)
    except (OSError, ValueError) as exc:
        raise ExportError(f"could not load the base pipeline {model_id}: {exc}", hint="pass it with --base PATH") from exc
    comps = {n: getattr(pipe, n) for n in parts}
    want: dict[tuple[str, str], torch.Tensor] = {}
    for comp, sd in parts.items():
        mods = kohya.peft_modules(sd)
        for module, pair in mods.items():
            try:
                w = comps[comp].get_submodule(module).weight
            except AttributeError as exc:
                raise ExportError(f"the adapter's {comp}.{module} is not in the base {model_id}",
                                  hint="merge onto the base the run trained on (--base PATH)") from exc
            r = pair["down"].shape[0]
            delta = (pair["up"].float().flatten(1) @ pair["down"].float().flatten(1)).reshape(w.shape)
            want[(comp, module)] = w.float() + trained_scale(m.alpha, r, m.rslora) * delta
    with tempfile.TemporaryDirectory() as tmp:
        write_diffusers(src, Path(tmp))
        try:
            pipe.load_lora_weights(tmp, weight_name="pytorch_lora_weights.safetensors")
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ExportError(f"the adapter does not fit the base {model_id}: {str(exc)[:300]}",
                              hint="merge onto the base the run trained on (--base PATH)") from exc
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    worst = 0.0
    for (comp, module), w in want.items():
        got = comps[comp].get_submodule(module).weight.float()
        worst = max(worst, float((got - w).abs().max() / w.abs().max().clamp_min(1e-6)))
    dtype = next(pipe.components[fam.denoiser_name].parameters()).dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    if worst > tol:
        raise ExportError(f"the fused pipeline differs from base + adapter by {worst:.2e}; nothing was written")
    pipe.save_pretrained(str(out))
    return {"max_diff": worst, "tolerance": tol}
