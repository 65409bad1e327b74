"""Model families as a small registry: what differs between SD 1.5, SDXL, FLUX.1, FLUX.2 klein and Wan.

One module per kind (``sd``, ``flux``, ``wan``) on the interface in ``base``; ``detect`` reads a
base model's family before anything loads; ``FAMILIES`` is built here once.
"""

from __future__ import annotations

from lorapod.engine.diffusion.families.base import Components, Family
from lorapod.engine.diffusion.families.detect import detect
from lorapod.engine.diffusion.families.flux import Flux1, Flux2Klein, pack, unpack
from lorapod.engine.diffusion.families.hunyuanvideo15 import HunyuanVideo15
from lorapod.engine.diffusion.families.qwenimage import QwenImage
from lorapod.engine.diffusion.families.sd import SD15, SDXL
from lorapod.engine.diffusion.families.wan import Wan21, Wan22
from lorapod.engine.diffusion.families.zimage import ZImage
from lorapod.errors import ModelLoadError, SpecError

__all__ = ["FAMILIES", "SD15", "SDXL", "Components", "Family", "Flux1", "Flux2Klein", "Wan21", "Wan22", "detect",
           "pack", "resolve_family", "unpack"]

# The registration: one class per row of catalog/families.py, in the table's order; each class
# carries its own name (tests/test_catalog_families.py holds the two equal).
FAMILIES: dict[str, type[Family]] = {cls.name: cls for cls in (SD15, SDXL, Flux1, Flux2Klein, Wan21, Wan22, ZImage,
                                                               HunyuanVideo15, QwenImage)}


def resolve_family(spec_family: str, model_id: str, revision: str | None = None) -> Family:
    """The family to train, refusing a base model of another family before anything is cached."""
    found, what = detect(model_id, revision)
    if spec_family in ("auto", "llm"):
        if found not in FAMILIES:
            raise ModelLoadError(f"{model_id} is a {what}, which lorapod's image engine does not train",
                                 hint=f"supported: {', '.join(FAMILIES)}")
        return FAMILIES[found]()
    if spec_family not in FAMILIES:
        raise SpecError(f"model.family {spec_family} is not trained by the image engine yet",
                        hint=f"supported: {', '.join(FAMILIES)}")
    if found != spec_family:
        raise ModelLoadError(
            f"the spec says model.family {spec_family}, but {model_id} is a {what} (family {found})",
            hint=f"set model.family: {found}" if found in FAMILIES else "use a base model of the spec's family",
        )
    return FAMILIES[spec_family]()
