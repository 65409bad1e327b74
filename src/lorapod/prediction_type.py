"""Which objective an SD 1.5 / SDXL model was trained on: epsilon (noise) or v-prediction.

A diffusers folder or hub id says it in its scheduler config. A single ``.safetensors`` file does
not: ``from_single_file`` gives every non-SD2 checkpoint an epsilon scheduler, so a v-pred model
(NoobAI-XL V-Pred and its many merges) would train silently on the wrong target. The file can
still tell, and is read here in this order:

1. a ``v_pred`` tensor key (the marker NoobAI and ComfyUI use),
2. kohya's ``ss_v_parameterization`` or the ``modelspec.prediction_type`` metadata,
3. a hub id or file name the catalog knows as v-pred (``v_prediction_models`` in models.yaml).

Otherwise epsilon, said loudly in the plan and the run log. ``model.prediction_type`` overrides
all of it. Only the safetensors header is read (no torch, no weights), so the planner can call it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from lorapod.catalog.families import FAMILIES
from lorapod.errors import ModelLoadError, SpecError

DEFAULTED = "epsilon (nothing in the file says which objective it was trained on)"


def safetensors_header(path: Path) -> tuple[set[str], dict[str, str]]:
    """(tensor names, ``__metadata__``) of a .safetensors file, from its JSON header only."""
    try:
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            if n > 100 * 2**20:
                raise ValueError("header larger than 100 MiB")
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"cannot read the safetensors header of {path}: {exc}",
                             hint="check that the file is a complete .safetensors checkpoint") from exc
    meta = header.pop("__metadata__", None) or {}
    return set(header), {str(k): str(v) for k, v in meta.items()}


def detect_single_file(path: str | Path) -> tuple[str | None, str]:
    """(``v_prediction`` / ``epsilon`` / None when nothing tells, what told)."""
    from lorapod.catalog.models import v_prediction_name

    p = Path(path).expanduser()
    keys, meta = safetensors_header(p)
    if "v_pred" in keys or "model.v_pred" in keys:
        return "v_prediction", "its 'v_pred' key"
    flag = meta.get("ss_v_parameterization")
    if flag is not None and flag.strip().lower() in ("true", "false"):
        return ("v_prediction" if flag.strip().lower() == "true" else "epsilon"), f"ss_v_parameterization={flag}"
    spec_type = meta.get("modelspec.prediction_type", "").strip().lower()
    if spec_type in ("v", "v_prediction", "v-prediction"):
        return "v_prediction", f"modelspec.prediction_type={spec_type}"
    if spec_type == "epsilon":
        return "epsilon", "modelspec.prediction_type=epsilon"
    known = v_prediction_name(p.name)
    if known:
        return "v_prediction", f"its name matches the catalog's v-pred entry '{known}'"
    return None, ""


def expected(model_id: str, family: str, setting: str = "auto") -> tuple[str | None, str]:
    """What the engine will train, as far as can be told before loading: (type or None, why).

    None means "the model's own scheduler config decides" (diffusers folders and hub ids).
    Used by the planner to warn about the epsilon default before a GPU is rented.
    """
    if family not in FAMILIES or FAMILIES[family].flow:  # flow matching has no epsilon / v choice
        return None, ""
    if setting != "auto":
        return setting, "model.prediction_type"
    from lorapod.catalog.models import v_prediction_name

    p = Path(model_id).expanduser()
    if p.is_file() and p.suffix == ".safetensors":
        found, why = detect_single_file(p)
        return (found, why) if found else ("epsilon", DEFAULTED)
    known = v_prediction_name(model_id)
    if known:
        return "v_prediction", f"the catalog's v-pred entry '{known}'"
    return None, ""


def resolve(model_id: str, family, setting: str, scheduler_type: str) -> tuple[str, str, bool]:
    """(prediction type to train, why, defaulted?) for a loaded model whose scheduler says ``scheduler_type``."""
    if family.flow:
        if setting != "auto":
            raise SpecError(f"model.prediction_type {setting} is for SD 1.5/SDXL; {family.name} trains flow matching",
                            hint="remove model.prediction_type (or set it to auto)")
        return "flow", "flow matching", False
    if setting != "auto":
        return setting, "model.prediction_type", False
    p = Path(model_id).expanduser()
    if p.is_file():
        found, why = detect_single_file(p)
        if found:
            return found, why, False
        return "epsilon", DEFAULTED, True
    from lorapod.catalog.models import v_prediction_name

    known = v_prediction_name(model_id)
    if known and scheduler_type != "v_prediction":
        return "v_prediction", f"the catalog's v-pred entry '{known}'", False
    return scheduler_type, "the model's scheduler config", False


def loud_default(model_id: str) -> str:
    """The warning for a single file trained as epsilon because nothing told otherwise."""
    return (f"{Path(model_id).name}: nothing in the file says whether it is a v-prediction model (no 'v_pred' key, "
            "no ss_v_parameterization metadata, no catalog name), so it trains on the EPSILON objective. If it is a "
            "v-pred checkpoint (NoobAI-XL V-Pred and its merges are), set model.prediction_type: v_prediction "
            "(or `lorapod train --v-pred`), or the LoRA will learn the wrong target")
