"""``lorapod inspect FILE``: what a LoRA file is and what each consumer would do with it.

Reads PEFT folders / files, diffusers and kohya ``.safetensors`` and llama.cpp ``.gguf``; reports
format, family, rank, alpha, target modules and metadata, and for ComfyUI, diffusers and
llama.cpp which modules each would load and which it would drop, and at what scale.

The consumer rules are name rules (no base model is loaded), taken from each consumer's key
mapping: ComfyUI's comfy/lora.py + comfy/utils.py (kohya ``lora_unet_`` / ``lora_te*_text_model_``
names, OneTrainer ``lora_transformer_`` and diffusers ``transformer.`` names for Flux, diffusers
``unet.`` names only in the old ``processor.to_q`` spelling; for Wan, ``lora_unet_`` + the original
Wan module path, the generic rule of ``model_lora_keys_unet`` over ComfyUI's own WanModel), diffusers'
LoRA loaders and convert_lora_to_gguf's refusals (see docs/export.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lorapod.errors import ExportError

CLIP_LAYER = r"text_model_encoder_layers_\d+_(self_attn_(q|k|v|out)_proj|mlp_fc[12])"
SD_UNET = r"(down_blocks|up_blocks|mid_block|input_blocks|middle_block|output_blocks|conv_in|conv_out|time_embed" \
          r"|time_embedding|add_embedding|label_emb|out)_.*|conv_in|conv_out"
BFL = (r"double_blocks_\d+_(img|txt)_(attn_(qkv|proj)|mlp_[02]|mod_lin)|single_blocks_\d+_(linear[12]|modulation_lin)"
       r"|img_in|txt_in|(time|vector|guidance)_in_(in|out)_layer|final_layer_(linear|adaLN_modulation_1)")
FLUX_DIFFUSERS = (r"(single_)?transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|to_out|add_[qkv]_proj|to_add_out"
                  r"|to_qkv_mlp_proj)|ff(_context)?\.(net\.0\.proj|net\.2|linear_in|linear_out)|proj_mlp|proj_out"
                  r"|norm1?(_context)?\.linear)|x_embedder|context_embedder|proj_out|norm_out\.linear"
                  r"|time_(text|guidance)_embed\.\w+\.linear_[12]")
# ComfyUI's WanModel (comfy/ldm/wan/model.py, "original version: Wan-Video/Wan2.1 wan/modules/model.py"):
# its Linear and Conv weights, which comfy/lora.py model_lora_keys_unet maps as ``lora_unet_<path, . as _>``
# onto ``diffusion_model.<path>.weight``. (comfy/lora_convert.py convert_lora_wan_fun also reads the
# Wan-Fun spelling ``lora_unet__blocks_...`` by removing the second underscore.)
WAN = (r"_?blocks_\d+_(self_attn_[qkvo]|cross_attn_([qkvo]|k_img|v_img)|ffn_[02])|patch_embedding"
       r"|(text|time)_embedding_[02]|time_projection_1|head_head|img_emb_proj_[0134]")

# musubi-tuner's Z-Image LoRA names the DiT's own separate to_q/k/v; ComfyUI's Lumina2 NextDiT
# (comfy/ldm/lumina/model.py) fuses them in ``attention.qkv``, and comfy/lora.py maps those names only in
# their PEFT spellings: the family's own rule (families/zimage comfy_unet) drops them, this says why.
def _modules(keys: list[str]) -> dict[str, dict[str, str]]:
    """module -> {'down': key, 'up': key, 'alpha': key} for kohya and PEFT spellings."""
    tags = ((".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora_A.weight", "down"),
            (".lora_B.weight", "up"), (".alpha", "alpha"))
    mods: dict[str, dict[str, str]] = {}
    for k in keys:
        for tag, kind in tags:
            if k.endswith(tag):
                mods.setdefault(k[: -len(tag)], {})[kind] = k
                break
        else:
            mods.setdefault(k, {})["other"] = k
    return mods


def _format(keys: list[str]) -> str:
    if any(k.startswith(("lora_unet_", "lora_te", "lora_transformer_")) for k in keys):
        return "kohya"
    if any(k.startswith(("unet.", "transformer.", "text_encoder.", "text_encoder_2.")) for k in keys):
        return "diffusers"
    if any(k.startswith("base_model.model.") for k in keys):
        return "peft"
    return "unknown"


def _named_families() -> dict[str, Any]:
    """The families that carry their inspect rules in their own folder (``Family.comfy_unet``)."""
    from lorapod.engine.diffusion.families import FAMILIES

    return {n: cls for n, cls in FAMILIES.items() if cls.comfy_unet is not None}


def _family(fmt: str, keys: list[str], meta: dict[str, str]) -> str:
    version = meta.get("ss_base_model_version", "")
    if version:
        from lorapod.catalog.families import of_base_version

        return of_base_version(version) or ("sdxl" if "sdxl" in version else version)
    joined = "\n".join(keys)
    if fmt == "peft":
        return "llm"
    for name, cls in _named_families().items():
        if cls.inspect_signature and re.search(cls.inspect_signature, joined, re.M):
            return name
    if re.search(r"^lora_unet__?blocks_\d+_(self|cross)_attn_", joined, re.M):
        return "wan"
    # diffusers' WanTransformer3DModel (what the video engine's save_lora_weights writes): ``blocks.N``
    # where Flux's transformers have ``transformer_blocks.N`` / ``single_transformer_blocks.N``
    if re.search(r"^transformer\.(blocks\.\d+\.(attn[12]|ffn)\.|condition_embedder\.)", joined, re.M):
        return "wan"
    if "to_qkv_mlp_proj" in joined or "ff.linear_in" in joined or "ff_linear_in" in joined:
        return "flux2"
    if re.search(r"^(lora_unet_(double|single)_blocks|lora_transformer_|transformer\.)", joined, re.M):
        return "flux1 or flux2"
    if "lora_te2_" in joined or "text_encoder_2." in joined or "add_embedding" in joined:
        return "sdxl"
    return "sd15 or sdxl"


def _comfy(module: str, family: str) -> tuple[bool, str]:
    named = _named_families().get(family)
    if named is not None:
        if module.startswith("lora_unet_"):
            for pattern, why in named.comfy_refused:
                if re.fullmatch(pattern, module[len("lora_unet_"):]):
                    return False, why
            ok = re.fullmatch(named.comfy_unet, module[len("lora_unet_"):]) is not None
            return ok, "" if ok else "not a module of ComfyUI's model"
        if module.startswith("transformer.") and named.comfy_takes_diffusers:
            return True, ""
        if module.startswith("transformer."):
            return False, ("diffusers name: ComfyUI maps lora_unet_ + its own module names "
                           "(`lorapod export RUN --to comfyui` writes them)")
        return False, "unknown name"
    flux = family.startswith("flux")
    if module.startswith("lora_unet_"):
        rest = module[len("lora_unet_"):]
        ok = re.fullmatch(BFL if flux else WAN if family.startswith("wan") else SD_UNET, rest) is not None
        return ok, "" if ok else "not a module of the model"
    for p in ("lora_te_", "lora_te1_", "lora_te2_"):
        if module.startswith(p):
            if re.fullmatch(CLIP_LAYER, module[len(p):]):
                return True, ""
            if module[len(p):].startswith("encoder_layers"):
                return False, "text-encoder name without text_model_ (transformers 5 path): dropped"
            return False, "not a CLIP layer ComfyUI maps"
    if module.startswith("lora_transformer_") and flux:
        return True, ""
    if module.startswith("transformer.") and flux:
        ok = re.fullmatch(FLUX_DIFFUSERS, module[len("transformer."):]) is not None
        return ok, "" if ok else "not a Flux module"
    if module.startswith("transformer.") and family.startswith("wan"):
        return False, ("diffusers Wan name: ComfyUI's Wan map takes lora_unet_ + Wan's own module names "
                       "(`lorapod export RUN --to comfyui` writes them)")
    if module.startswith("unet."):
        if ".to_" in module and ".processor." not in module:
            return False, "diffusers attention name (ComfyUI maps only unet.*.processor.to_q style)"
        return True, ""
    if re.fullmatch(r"text_encoder(_2)?\.text_model\.encoder\.layers\.\d+\.(self_attn\.(q|k|v|out)_proj|mlp\.fc[12])", module):
        return True, ""
    return False, "unknown name"


def _diffusers(module: str, family: str) -> tuple[bool, str]:
    if module.startswith(("unet.", "transformer.", "text_encoder.", "text_encoder_2.")):
        return True, ""
    if module.startswith("lora_unet_") and family.startswith("flux"):
        ok = re.fullmatch(BFL, module[len("lora_unet_"):]) is not None
        return ok, "" if ok else "no sd-scripts Flux name"
    if module.startswith("lora_transformer_"):
        if re.search(r"_(ff|ff_context)_|proj_mlp", module):
            return False, "diffusers' OneTrainer-Flux converter has no rule for MLP layers (it fails on the file)"
        return True, ""
    if module.startswith(("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")):
        if module.startswith("lora_te") and "_text_model_" not in module:
            return False, "text-encoder name without text_model_"
        return True, ""
    return False, "unknown name"


class _Lora:
    """What inspect needs of a .safetensors LoRA, read without torch (issue 48, F19: importing torch,
    transformers and diffusers took 6-14 s to inspect a tiny file): every tensor's shape, and the
    values of the scalar ``.alpha`` tensors. safetensors' numpy reader gives shapes and float32 /
    float16 scalars; a bfloat16 scalar (numpy has no bfloat16; sd-scripts saves alphas in the save
    dtype) is read from the file's bytes at the offsets its header gives (the safetensors format:
    an 8-byte little-endian header length, a JSON header, then the data)."""

    def __init__(self, path: Path) -> None:
        from safetensors import SafetensorError, safe_open

        if not path.is_file():
            raise ExportError(f"{path} does not exist", hint="check the path")
        try:
            with safe_open(str(path), "numpy") as fh:
                self.meta: dict[str, str] = dict(fh.metadata() or {})
                self.shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
                self.alphas: dict[str, float] = {}
                for k in self.shapes:
                    if k.endswith(".alpha"):
                        self.alphas[k] = self._scalar(fh, path, k)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ExportError(f"{path} is not a readable safetensors file ({exc})",
                              hint="it may be truncated or not a safetensors file: copy it again") from exc

    @staticmethod
    def _scalar(fh: Any, path: Path, key: str) -> float:
        import numpy as np

        try:
            return float(np.asarray(fh.get_tensor(key)).reshape(-1)[0])
        except (TypeError, ValueError):  # bfloat16: the upper half of a float32
            with path.open("rb") as raw:
                n = int.from_bytes(raw.read(8), "little")
                entry = json.loads(raw.read(n))[key]
                if entry.get("dtype") != "BF16":
                    raise
                raw.seek(8 + n + int(entry["data_offsets"][0]))
                return float(np.frombuffer(b"\x00\x00" + raw.read(2), dtype="<f4")[0])


def _scale(mod: dict[str, str], lora: _Lora) -> tuple[int, float | None, float]:
    rank = int(lora.shapes[mod["down"]][0]) if "down" in mod else 0
    alpha = lora.alphas.get(mod["alpha"]) if "alpha" in mod else None
    return rank, alpha, (alpha / rank if alpha is not None and rank else 1.0)


def _trained_alpha_near(path: Path) -> tuple[float, int, bool, str] | None:
    """A PEFT-keyed file carries no alpha: find it where lorapod keeps it. ``adapter_config.json``
    beside the file, or, for a checkpoint (``runs/JOB/checkpoints/step-N/adapter.safetensors``),
    the run's ``spec.yaml``. Returns (alpha, rank, rslora, where it came from)."""
    cfg_file = path.parent / "adapter_config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
            return float(cfg["lora_alpha"]), int(cfg["r"]), bool(cfg.get("use_rslora")), str(cfg_file)
        except (ValueError, KeyError, TypeError):
            return None
    run_root = path.parent.parent.parent
    from lorapod.rundir.layout import CHECKPOINTS

    if path.parent.parent.name == CHECKPOINTS and (run_root / "spec.yaml").is_file():
        from lorapod.errors import LorapodError
        from lorapod.spec import load_spec

        try:
            m = load_spec(run_root / "spec.yaml").method
        except (LorapodError, OSError, ValueError):
            return None
        return float(m.alpha), int(m.r), bool(m.rslora), str(run_root / "spec.yaml")
    return None


def inspect_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir() and (path / "adapter.safetensors").is_file() and (path / "state.json").is_file():
        path = path / "adapter.safetensors"  # a checkpoint folder: its adapter
    if path.is_dir():
        return _peft_folder(path)
    if path.suffix == ".gguf":
        return _gguf(path)
    tensors = _Lora(path)
    meta = tensors.meta
    keys = sorted(tensors.shapes)
    fmt = _format(keys)
    mods = _modules(keys)
    if fmt == "unknown" or not any("down" in m for m in mods.values()):
        raise ExportError(f"{path} is not a LoRA file (no lora_down/lora_A keys; e.g. {keys[0] if keys else 'empty'})",
                          hint="inspect reads PEFT, diffusers, kohya .safetensors and llama.cpp .gguf LoRAs")
    family = _family(fmt, keys, meta)
    trained_alpha = _meta_alpha(meta)
    report: dict[str, Any] = {"file": str(path), "format": fmt, "family": family, "modules": len(mods),
                              "metadata": {k: (v if len(v) < 200 else v[:200] + "...") for k, v in meta.items()}}
    ranks = sorted({_scale(m, tensors)[0] for m in mods.values() if "down" in m})
    alphas = sorted({_scale(m, tensors)[1] for m in mods.values() if "alpha" in m})
    report["rank"] = ranks
    report["alpha"] = alphas or None
    report["targets"] = sorted({re.sub(r"[._]\d+[._]", ".N.", k).rsplit(".N.", 1)[-1] for k in mods})[:40]
    flags = []
    if not alphas and fmt == "kohya":
        flags.append("no .alpha keys: ComfyUI, Forge and A1111 apply scale 1.0 (alpha = rank)")
    consumers: dict[str, Any] = {}
    if fmt == "peft":
        consumers["llama.cpp"] = _llamacpp_peft(keys)
        consumers["PEFT"] = {"loads": len(mods), "drops": [], "scale": "from adapter_config.json"}
        near = _trained_alpha_near(path)  # adapter_config.json beside it (a PEFT folder's file too), or the run's spec
        if near is not None:
            alpha, r, rslora, where = near
            report["alpha"], report["alpha_from"] = [alpha], where
            for c in consumers.values():
                c["scale"] = [round(alpha / (r ** 0.5 if rslora else r), 6)]
        else:
            for c in consumers.values():
                c["scale"] = "unknown"
            flags.append("PEFT keys carry no alpha and no adapter_config.json or run spec is beside this file: the "
                         "scale is unknown; inspect the adapter folder (adapter_config.json) instead")
    else:
        for name, rule in (("ComfyUI", _comfy), ("diffusers", _diffusers)):
            loads, drops, scales = 0, [], set()
            for module, m in mods.items():
                ok, why = rule(module, family)
                if ok and "down" in m:
                    loads += 1
                    rank, alpha, s = _scale(m, tensors)
                    if name == "diffusers" and alpha is None and trained_alpha is not None:
                        s = trained_alpha / rank  # diffusers reads the alpha from the file's metadata
                    scales.add(round(s, 6))
                elif not ok:
                    drops.append(f"{module}: {why}")
            consumers[name] = {"loads": loads, "drops": drops, "scale": sorted(scales)}
        if fmt == "diffusers" and not alphas:
            flags.append("no .alpha keys: ComfyUI applies scale 1.0" +
                         (f", not the trained {trained_alpha}/rank" if trained_alpha is not None else ""))
    report["consumers"] = consumers
    report["flags"] = flags + [f"{n} drops {len(c['drops'])} module(s)" for n, c in consumers.items() if c["drops"]]
    return report


def _meta_alpha(meta: dict[str, str]) -> float | None:
    raw = meta.get("lora_adapter_metadata")
    if raw:
        try:
            cfg = json.loads(raw)
        except ValueError:
            return None
        for k, v in cfg.items():
            if k.endswith("lora_alpha") and isinstance(v, (int, float)):
                return float(v)
    return None


def _llamacpp_peft(keys: list[str]) -> dict[str, Any]:
    """What convert_lora_to_gguf would take: lora_A/B of Llama-layout modules; full weights refused."""
    drops, loads = [], 0
    for k in keys:
        if ".lora_A." not in k and ".lora_B." not in k:
            drops.append(f"{k}: a full weight in an adapter (llama.cpp refuses the whole file)")
            continue
        module = re.sub(r"\.lora_[AB]\.weight$", "", k)  # export/kohya.py split_peft_key, without its torch
        if k.endswith(".lora_A.weight"):
            if re.search(r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$|lm_head$", module):
                loads += 1
            else:
                drops.append(f"{module}: no llama.cpp tensor name")
    return {"loads": loads, "drops": drops, "scale": "adapter.lora.alpha / rank"}


def _peft_folder(path: Path) -> dict[str, Any]:
    cfg_file = path / "adapter_config.json"
    weights = path / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise ExportError(f"{path} is not a PEFT adapter folder (needs adapter_config.json and adapter_model.safetensors)")
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    report = inspect_file(weights)
    scale = cfg["lora_alpha"] / (cfg["r"] ** 0.5 if cfg.get("use_rslora") else cfg["r"])
    report.update({"file": str(path), "alpha": [cfg["lora_alpha"]], "rslora": bool(cfg.get("use_rslora")),
                   "base": cfg.get("base_model_name_or_path"), "targets": cfg.get("target_modules")})
    for c in report["consumers"].values():
        if c.get("scale") in ("from adapter_config.json", "adapter.lora.alpha / rank"):
            c["scale"] = [round(scale, 6)]
    return report


def _gguf(path: Path) -> dict[str, Any]:
    from lorapod.export import gguf

    kv, tensors = gguf.read(path)
    kind = kv.get("general.type")
    report: dict[str, Any] = {"file": str(path), "format": "gguf", "family": f"llm ({kv.get('general.architecture')})",
                              "metadata": {k: v for k, v in kv.items() if not k.startswith("tokenizer.ggml.")}}
    if kind != "adapter":
        raise ExportError(f"{path} is a GGUF {kind or 'model'} ({kv.get('general.architecture')}, {len(tensors)} "
                          "tensors), not a LoRA adapter",
                          hint="inspect reads LoRA adapters; `lorapod export RUN --to gguf` writes a llama.cpp one")
    pairs = {k[: -len(".lora_a")]: k for k in tensors if k.endswith(".lora_a")}
    ranks = sorted({int(tensors[k].shape[0]) for k in pairs.values()})
    alpha = kv.get("adapter.lora.alpha")
    drops = [k for k in tensors if not k.endswith((".lora_a", ".lora_b"))]
    drops += [f"{n}: no .lora_b" for n in pairs if f"{n}.lora_b" not in tensors]
    report.update({"modules": len(pairs), "rank": ranks, "alpha": [alpha],
                   "targets": sorted({re.sub(r"^blk\.\d+\.", "", n) for n in pairs}),
                   "consumers": {"llama.cpp": {"loads": len(pairs), "drops": drops,
                                               "scale": [round(float(alpha) / r, 6) for r in ranks] if alpha else [1.0]}},
                   "flags": [] if alpha else ["no adapter.lora.alpha: llama.cpp applies scale 1.0"]})
    return report


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['file']}", f"  format  {r['format']}    family {r['family']}    modules {r.get('modules')}",
             f"  rank    {r.get('rank')}    alpha {r.get('alpha') if r.get('alpha') is not None else 'unknown'}"
             + ("  (rsLoRA)" if r.get("rslora") else "") + (f"  (from {r['alpha_from']})" if r.get("alpha_from") else "")]
    if r.get("base"):
        lines.append(f"  base    {r['base']}")
    lines.append(f"  targets {', '.join(map(str, r.get('targets') or []))}")
    for name, c in r.get("consumers", {}).items():
        lines.append(f"  {name:<10} loads {c['loads']} module(s) at scale {c['scale']}, drops {len(c['drops'])}")
        lines += [f"      - {d}" for d in c["drops"][:12]]
        if len(c["drops"]) > 12:
            lines.append(f"      ... and {len(c['drops']) - 12} more")
    interesting = {k: v for k, v in r.get("metadata", {}).items() if k.startswith(("ss_network", "ss_base", "modelspec.arch",
                                                                                       "general.", "adapter."))}
    for k, v in interesting.items():
        lines.append(f"  {k} = {v}")
    lines += [f"  ! {f}" for f in r.get("flags", [])]
    return "\n".join(lines)
