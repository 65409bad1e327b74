"""Wan's memory savers (the family itself is ``engine/diffusion/families/wan.py``).

- ``store_fp8``: the blocks' frozen Linear weights in float8 (Ada/Hopper), as the image engine does.
- ``BlockSwap``: the frozen weights of the last N blocks live in CPU RAM and visit the GPU only
  for their own forward (and its recomputation under gradient checkpointing, which it requires).
- ``check_fits``: refuse, before anything loads, a job that would not fit the GPU even with the
  most blocks swapped: the planner's memory model (``plan/vram.py``) on the planner's description
  of the model (``memory_model``), with the engine's own settings; there is no second Wan model.

The ComfyUI file's key rule (diffusers paths -> the original Wan module names) is
``export/kohya.py: WAN_RULES``, shared with ``lorapod export --to comfyui``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lorapod.catalog import families
from lorapod.errors import ModelLoadError

if TYPE_CHECKING:
    from lorapod.catalog.models import ImageModel
    from lorapod.plan.vram import Estimate

# ----------------------------------------------------------------------------- memory


def store_fp8(transformer: torch.nn.Module) -> int:
    """float8 storage for the frozen Linear weights inside ``blocks.N`` (the image engine's rule,
    engine/diffusion/fp8.py, with Wan's block names); upcast per call by ``Float8Linear``."""
    from lorapod.engine.diffusion.fp8 import store_fp8 as store

    return store(transformer, lambda name: name.startswith("blocks."))


class BlockSwap:
    """Keep the frozen weights of the last ``n`` transformer blocks in CPU RAM (pinned) and bring
    each block's weights to ``device`` just for its forward. The weights are frozen, so the CPU copy
    is made once and "offloading" only drops the GPU copy: nothing is copied back. LoRA weights
    (trainable) never move, so the optimizer and gradients are untouched. Under gradient
    checkpointing the backward pass recomputes the block's forward, which runs the same hooks;
    without it autograd would keep the GPU copies alive and nothing would be saved, so the caller
    turns checkpointing on."""

    def __init__(self, blocks: torch.nn.ModuleList, n: int, device: torch.device) -> None:
        self.device = torch.device(device)
        self.blocks = list(blocks)[len(blocks) - n :] if n > 0 else []
        self.moves = 0
        self._hooks = []
        self._cpu: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
        pin = self.device.type == "cuda"
        for b in self.blocks:
            for prm in b.parameters():
                if not prm.requires_grad:
                    host = prm.data.to("cpu")
                    self._cpu[id(prm)] = (prm, host.pin_memory() if pin else host)
                    prm.data = self._cpu[id(prm)][1]
            self._hooks.append(b.register_forward_pre_hook(lambda m, args: self._load(m)))
            self._hooks.append(b.register_forward_hook(lambda m, args, out: self._drop(m)))

    def _frozen(self, block: torch.nn.Module):
        return [self._cpu[id(p)] for p in block.parameters() if id(p) in self._cpu]

    def _load(self, block: torch.nn.Module) -> None:
        for prm, host in self._frozen(block):
            prm.data = host.to(self.device, non_blocking=True)
        self.moves += 1

    def _drop(self, block: torch.nn.Module) -> None:
        for prm, host in self._frozen(block):
            prm.data = host
        self.moves += 1

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        for b in self.blocks:
            self._load(b)


def component_config(model_id: str, revision: str | None = None, sub: str = "transformer") -> dict:
    """A component's config.json (transformer, vae: a few hundred bytes), read before any weight is loaded."""
    p = Path(model_id).expanduser()
    if p.is_dir():
        f = p / sub / "config.json"
        if not f.is_file():
            raise ModelLoadError(f"{p} has no {sub}/config.json", hint="point model.id at a diffusers Wan folder")
        return json.loads(f.read_text(encoding="utf-8"))
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(model_id, f"{sub}/config.json", revision=revision)).read_text())
    except Exception as exc:
        raise ModelLoadError(f"could not read {sub}/config.json of {model_id} ({exc.__class__.__name__}: {exc})",
                             hint="check the id and your network") from exc


def memory_model(spec) -> ImageModel:
    """The planner's description of this Wan job's model (``catalog.models.find_model``: a catalog row
    by name, a local folder sized by its own transformer config), so the engine's fit check and
    ``lorapod plan`` count the same model; a hub id the catalog does not name is sized from its
    transformer config here. ModelLoadError when the config cannot be read."""
    from lorapod.catalog.models import ImageModel, find_model, named_image_model, wan_model_from_config
    from lorapod.errors import PlanError

    cfg = component_config(spec.model.id, spec.model.revision)
    family = spec.model.family if spec.model.family in families.VIDEO else "auto"
    try:
        model = find_model(spec.model.id, family, spec.model.variant)
    except PlanError as exc:
        raise ModelLoadError(exc.message, hint=exc.hint) from exc
    if not isinstance(model, ImageModel) or not model.is_video:
        raise ModelLoadError(f"{spec.model.id} is not a Wan model the planner knows", hint="set model.family: wan21 or wan22")
    if Path(spec.model.id).expanduser().is_dir() or named_image_model(spec.model.id) is not None:
        return model
    spatial = int(component_config(spec.model.id, spec.model.revision, "vae").get("scale_factor_spatial", 8))
    try:
        component_config(spec.model.id, spec.model.revision, "transformer_2")
        experts = 2
    except ModelLoadError:
        experts = 1
    return wan_model_from_config(model, cfg, spatial=spatial, experts=experts)


def check_fits(spec, model: ImageModel, vram_gb: float, *, dtype: str, tokens: int, what: str) -> Estimate:
    """``plan.vram.check_fits`` with this job's settings as the engine runs them: the base in
    ``dtype``, lorapod's own layout, the largest window's ``tokens``; HardwareError if it cannot fit."""
    from lorapod.plan.vram import Settings
    from lorapod.plan.vram import check_fits as fits

    s = replace(Settings.from_spec(spec, model), base_dtype=dtype, framework="lorapod", image_tokens=tokens)
    return fits(model, s, vram_gb, what)
