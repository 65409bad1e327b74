"""Kohya-format image LoRAs (ComfyUI, Forge, A1111) from PEFT weights, and back.

One declarative ``Layout`` per family says how a diffusers module name becomes a kohya module
name; its rules live with the family's code (``Family.kohya_rules`` in
``engine/diffusion/families/``) and ``LAYOUTS`` is built from them, so adding a family changes
nothing here.

Names (what the consumers map; see docs/export.md):

- SD 1.5 / SDXL UNet: ``lora_unet_<diffusers module path, dots as _>``
  (ComfyUI ``unet_to_diffusers``, A1111/Forge, diffusers' kohya loader all map these).
- CLIP text encoders: ``lora_te_text_model_encoder_layers_<i>_<self_attn_q_proj|...|mlp_fc1>``
  (SD 1.5) and ``lora_te1_`` / ``lora_te2_`` (SDXL). transformers 5 dropped the ``text_model.``
  level of ``CLIPTextModel`` (not of ``CLIPTextModelWithProjection``), so module paths are
  normalised to carry it: consumers only know the 4.x names.
- FLUX.1 / FLUX.2: sd-scripts' layout on the original (BFL) module names,
  ``lora_unet_double_blocks_<i>_img_attn_qkv`` etc., which ComfyUI and Forge map for every
  model (``lora_unet_<state-dict key>``) and diffusers converts (``_convert_kohya_flux*``). Where
  BFL fuses layers that diffusers keeps apart (q, k, v -> ``qkv``; FLUX.1's single-block q, k, v
  and MLP -> ``linear1``) the parts are stacked: ``down`` concatenated, ``up`` block-diagonal, so
  ``up @ down`` is exactly the stacked per-part updates and loaders that split (diffusers)
  recover the parts exactly.

``.alpha``: loaders scale by ``alpha / rank`` with the rank read from ``lora_down``, so each module
stores ``alpha = trained_scale * its rank`` (a fused module has the summed rank): ``alpha`` for
plain LoRA, ``alpha * sqrt(rank)`` for rsLoRA, so loaded at strength 1.0 the effect is exactly the
trained effect. The file also carries sd-scripts' ``ss_*`` metadata (``kohya_metadata``), which
A1111 and model sites show.

The engine writes this file at the end of training and export converts to and from it, so this
module imports nothing of either (docs/architecture.md places it with the engine's layer) but the
families' own key rules (``engine/diffusion/families/<family>/``: ``Family.kohya_rules``).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file

from lorapod.catalog import families
from lorapod.errors import ExportError


def trained_scale(alpha: float, rank: int, rslora: bool) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def split_peft_key(key: str) -> tuple[str, str]:
    """'a.b.lora_A.weight' -> ('a.b', 'down'); lora_B -> 'up'."""
    for tag, kind in ((".lora_A.weight", "down"), (".lora_B.weight", "up")):
        if key.endswith(tag):
            return key[: -len(tag)], kind
    raise ExportError(f"not a LoRA weight key: {key}", hint="expected keys ending in .lora_A.weight / .lora_B.weight")


# ----------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Target:
    """Where one diffusers module goes: kohya module ``name``, as part ``index`` of ``parts``."""

    name: str
    index: int = 0
    parts: int = 1


# (regex on the diffusers module path, BFL module template with the regex groups, part, of parts)
Rule = tuple[str, str, int, int]  # the same type as engine/diffusion/families/base.py's

@dataclass(frozen=True)
class Layout:
    """How one family's components are named in a kohya file."""

    family: str
    denoiser: str  # 'unet' or 'transformer': the PEFT/diffusers component name
    te_prefixes: tuple[str, ...] = ()  # kohya prefix per text encoder (text_encoder, text_encoder_2)
    rules: tuple[Rule, ...] = field(default_factory=tuple)  # empty: diffusers paths as they are

    def components(self) -> dict[str, str]:
        """diffusers component -> kohya prefix."""
        out = {self.denoiser: "lora_unet"}
        for i, p in enumerate(self.te_prefixes):
            out["text_encoder" if i == 0 else f"text_encoder_{i + 1}"] = p
        return out

    def target(self, component: str, module: str) -> Target:
        prefix = self.components()[component]
        if component != self.denoiser:
            return Target(f"{prefix}_{te_path(module).replace('.', '_')}")
        if not self.rules:
            return Target(f"{prefix}_{module.replace('.', '_')}")
        for pattern, template, index, parts in self.rules:
            m = re.fullmatch(pattern, module)
            if m:
                return Target(f"{prefix}_{template.format(*m.groups()).replace('.', '_')}", index, parts)
        raise ExportError(f"{self.family}: the module {module} has no name in the kohya (sd-scripts) layout",
                          hint="train only the default target modules, or export with --to diffusers")


def _family_layouts() -> dict[str, Layout]:
    """Every family's layout, from its own code (``Family.kohya_rules``, ``kohya_te_prefixes``,
    ``denoiser_name`` in engine/diffusion/families/): a new family touches no line here."""
    from lorapod.engine.diffusion.families import FAMILIES

    return {name: Layout(name, cls.denoiser_name, tuple(cls.kohya_te_prefixes), tuple(cls.kohya_rules))
            for name, cls in FAMILIES.items()}


LAYOUTS: dict[str, Layout] = _family_layouts()


#: Wan 2.2's two experts, each its own file: the component -> the file name's suffix (the
#: high-noise expert is ``transformer``, the low-noise one ``transformer_2``, as WanPipeline names them)
EXPERT_FILES = {"transformer": "_high_noise", "transformer_2": "_low_noise"}


def files_of(parts: dict[str, dict[str, torch.Tensor]], two_experts: bool = False
             ) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """The kohya files an adapter makes: file-name suffix -> the parts :func:`to_kohya` takes. One
    file, except for a Wan 2.2 model with two experts (``two_experts``): one file per expert
    trained, each expert's transformer under the layout's one denoiser name."""
    if not two_experts:
        return {"": parts}
    if set(parts) - set(EXPERT_FILES):
        raise ExportError(f"a Wan 2.2 adapter holds only its experts, not {sorted(set(parts) - set(EXPERT_FILES))}")
    return {EXPERT_FILES[c]: {"transformer": parts[c]} for c in EXPERT_FILES if c in parts}


def layout(family: str) -> Layout:
    if family not in LAYOUTS:
        raise ExportError(f"no kohya layout for the family {family}", hint=f"known: {', '.join(LAYOUTS)}")
    return LAYOUTS[family]


def te_path(module: str) -> str:
    """A CLIP text-encoder module path as consumers know it (transformers 4.x: under ``text_model.``)."""
    return module if module.startswith("text_model.") else f"text_model.{module}"


# ----------------------------------------------------------------------------- PEFT -> kohya


def peft_modules(sd: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{'a.b.lora_A.weight': A, 'a.b.lora_B.weight': B} -> {'a.b': {'down': A, 'up': B}}."""
    mods: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        module, kind = split_peft_key(key)
        mods.setdefault(module, {})[kind] = value
    for module, pair in mods.items():
        if set(pair) != {"down", "up"}:
            raise ExportError(f"{module} has lora_{'A' if 'down' in pair else 'B'} but not its partner")
    return mods


def to_kohya(parts: dict[str, dict[str, torch.Tensor]], family: str, alpha: float, rslora: bool,
             dtype: torch.dtype = torch.float16, out_features: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """PEFT state dicts per component ('unet', 'text_encoder', ...; keys without prefix) -> kohya tensors.

    ``out_features`` (diffusers module -> output size) is needed only when a fused BFL module is
    missing some of its parts (e.g. FLUX.1's ``linear1`` with q, k, v trained but not the MLP).
    """
    lay = layout(family)
    groups: dict[str, dict[int, tuple[str, torch.Tensor, torch.Tensor]]] = {}
    nparts: dict[str, int] = {}
    for comp, sd in parts.items():
        if comp not in lay.components():
            raise ExportError(f"{family} has no component {comp} in the kohya layout")
        for module, pair in peft_modules(sd).items():
            t = lay.target(comp, module)
            groups.setdefault(t.name, {})[t.index] = (module, pair["down"].float(), pair["up"].float())
            nparts[t.name] = t.parts
    out: dict[str, torch.Tensor] = {}
    for name, got in groups.items():
        down, up = _stack(name, got, nparts[name], out_features or {})
        rank = down.shape[0]
        r_part = next(iter(got.values()))[1].shape[0]
        out[f"{name}.lora_down.weight"] = down.to(dtype).contiguous()
        out[f"{name}.lora_up.weight"] = up.to(dtype).contiguous()
        out[f"{name}.alpha"] = torch.tensor(trained_scale(alpha, r_part, rslora) * rank, dtype=torch.float32)
    return out


def _stack(name: str, got: dict[int, tuple[str, torch.Tensor, torch.Tensor]], n: int,
           out_features: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    if n == 1:
        _, down, up = got[0]
        return down, up
    ranks = {d.shape[0] for _, d, _ in got.values()}
    if len(ranks) != 1:
        raise ExportError(f"{name}: its parts have different ranks {sorted(ranks)}; a fused module needs one rank")
    r = ranks.pop()
    d_in = next(iter(got.values()))[1].shape[1]
    downs, ups = [], []
    for i in range(n):
        if i in got:
            _, d, u = got[i]
        else:  # an untrained part: zeros, so loaders that split recover the trained parts exactly
            rows = _missing_rows(name, i, got, out_features)
            # beside the trained parts, wherever they are (the adapter's, on the GPU during training)
            like = next(iter(got.values()))[1]
            d = torch.zeros(r, d_in, device=like.device, dtype=like.dtype)
            u = torch.zeros(rows, r, device=like.device, dtype=like.dtype)
        downs.append(d)
        ups.append(u)
    return torch.cat(downs, 0), torch.block_diag(*ups)


def _missing_rows(name: str, i: int, got: dict[int, tuple[str, torch.Tensor, torch.Tensor]],
                  out_features: dict[str, int]) -> int:
    sizes = {u.shape[0] for idx, (_, _, u) in got.items() if idx < 3}
    if i < 3 and sizes:  # q, k and v have one size
        return sizes.pop()
    for module, _, _ in got.values():
        sibling = _sibling(module, i)
        if sibling in out_features:
            return out_features[sibling]
    raise ExportError(f"{name}: part {i} was not trained and its size is unknown",
                      hint="give the base model (lorapod export ... --base MODEL reads the sizes from it)")


def _sibling(module: str, i: int) -> str:
    block = module.rsplit(".attn.", 1)[0] if ".attn." in module else module.rsplit(".", 1)[0]
    return f"{block}.{['attn.to_q', 'attn.to_k', 'attn.to_v', 'proj_mlp'][i]}"


# ----------------------------------------------------------------------------- kohya -> PEFT


def kohya_modules(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Group kohya keys: {'lora_unet_x': {'down': .., 'up': .., 'alpha': ..}}. Unknown keys raise."""
    mods: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        for tag, kind in ((".lora_down.weight", "down"), (".lora_up.weight", "up"), (".alpha", "alpha")):
            if key.endswith(tag):
                mods.setdefault(key[: -len(tag)], {})[kind] = value
                break
        else:
            raise ExportError(f"not a kohya LoRA key: {key}",
                              hint="kohya keys end in .lora_down.weight, .lora_up.weight or .alpha")
    return mods


def name_table(family: str, modules: dict[str, list[str]]) -> dict[str, list[tuple[str, str, int, int]]]:
    """kohya module -> [(component, diffusers module, part, of parts)] for the given diffusers module names."""
    lay = layout(family)
    table: dict[str, list[tuple[str, str, int, int]]] = {}
    for comp, names in modules.items():
        if comp not in lay.components():
            continue
        for module in names:
            try:
                t = lay.target(comp, module)
            except ExportError:
                continue
            table.setdefault(t.name, []).append((comp, module, t.index, t.parts))
    for entries in table.values():
        entries.sort(key=lambda e: e[2])
    return table


def from_kohya(tensors: dict[str, torch.Tensor], family: str,
               modules: dict[str, list[str]]) -> tuple[dict[str, dict[str, torch.Tensor]], list[str]]:
    """kohya tensors -> PEFT state dicts per component, with each module's ``alpha / rank`` folded
    into ``lora_B`` (so the result loads at LoRA scale 1: ``lora_alpha == r``). Fused modules are
    split back into their parts. ``modules`` lists the diffusers module names per component (the
    base model's); returns (parts, kohya modules that name nothing in it)."""
    table = name_table(family, modules)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    dropped: list[str] = []
    for kname, w in kohya_modules(tensors).items():
        if kname not in table or "down" not in w or "up" not in w:
            dropped.append(kname)
            continue
        down, up = w["down"].float(), w["up"].float()
        rank = down.shape[0]
        scale = float(w["alpha"]) / rank if "alpha" in w else 1.0
        entries = table[kname]
        pieces = _split(down, up * scale, entries[0][3])
        for comp, module, idx, _n in entries:
            d, u = pieces[idx]
            parts.setdefault(comp, {})[f"{module}.lora_A.weight"] = d.contiguous()
            parts[comp][f"{module}.lora_B.weight"] = u.contiguous()
    return parts, dropped


def _split(down: torch.Tensor, up: torch.Tensor, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    if n == 1:
        return {0: (down, up)}
    rows = up.shape[0]
    d_in = down.shape[1]
    # q, k, v have the input size as output size in every Flux; the remainder is the MLP part
    dims = [rows // n] * n if rows % n == 0 and n == 3 else [d_in] * 3 + [rows - 3 * d_in]
    rank = down.shape[0]
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    ups = torch.split(up, dims, 0)
    if rank % n == 0:
        r = rank // n
        blocks = [ups[j][:, k * r:(k + 1) * r] for j in range(n) for k in range(n) if j != k]
        if all(bool((b == 0).all()) for b in blocks):  # block-diagonal: each part has its own rank slice
            for j in range(n):
                out[j] = (down[j * r:(j + 1) * r], ups[j][:, j * r:(j + 1) * r])
            return out
    return {j: (down, ups[j]) for j in range(n)}


# ----------------------------------------------------------------------------- the file

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
