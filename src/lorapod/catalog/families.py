"""The diffusion families lorapod knows: one frozen row each, and the one pipeline-class reading.

Every fact that differs by family and is not code lives here once: which diffusers pipeline
classes mean the family, whether it is video, its training resolution, the guidance its samples
use by default, and the names kohya-style metadata gives its base model. The spec, the data
checks, the planner, the engine, export and inspect read this table; the engine's
``engine/diffusion/families/`` holds only the code (loading, encoding, the denoiser call) and
has one class per row (``tests/test_catalog_families.py`` fails if a row has no class, or a class no row).

The table is built once, at import, and never changed afterwards (a ``MappingProxyType``):
nothing registers a family into it from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from lorapod.errors import SpecError


@dataclass(frozen=True)
class FamilyFacts:
    """What lorapod knows about one diffusion family, apart from how to run it."""

    name: str  # model.family in a spec
    title: str  # for people
    pipelines: tuple[str, ...]  # model_index.json "_class_name" values that are this family
    resolution: int  # training resolution (DOMAIN.md "Data rules"; Wan2.1 trains at 960x960)
    guidance: float  # default guidance scale of the samples (each pipeline's own default)
    kohya_base_version: str  # ss_base_model_version (sd-scripts / musubi-tuner conventions)
    modelspec_architecture: str  # modelspec.architecture (Stability's ModelSpec, as sd-scripts writes it)
    # what reads the captions: "clip" (CLIP only: the text past its 77-token window is cut), "clip+t5"
    # (FLUX.1: CLIP cuts, T5 still reads the rest), or an encoder without that window
    text_encoders: str = "clip"
    flow: bool = True  # flow matching; False: DDPM noise prediction (epsilon or v, lorapod.prediction_type)
    is_video: bool = False
    # Which of the planner's accuracy groups (plan/fit.py, bench/plan_accuracy.py) the family's
    # measurements fall in: families of one architecture share one speed and memory behaviour.
    speed_group: str = ""
    # lorapod's engine can keep this family's transformer blocks in CPU RAM (train.blocks_to_swap:
    # engine/diffusion/memory.py); the U-Nets have no blocks. ``engine_supports`` reads it.
    swaps_blocks: bool = True


# Pipeline classes: diffusers' own (``src/diffusers/pipelines/*``). Guidance: each pipeline's own
# ``__call__`` default (FluxPipeline 3.5, Flux2KleinPipeline 4.0, WanPipeline 5.0), except SD/SDXL:
# 7.0, lorapod's choice since its first sample grids (StableDiffusionPipeline's default is 7.5).
_ROWS = (
    FamilyFacts("sd15", "Stable Diffusion 1.5", ("StableDiffusionPipeline",), 512, 7.0,
                "sd_v1", "stable-diffusion-v1/lora", flow=False, speed_group="SD/SDXL", swaps_blocks=False),
    FamilyFacts("sdxl", "SDXL", ("StableDiffusionXLPipeline",), 1024, 7.0,
                "sdxl_base_v1-0", "stable-diffusion-xl-v1-base/lora", flow=False, speed_group="SD/SDXL",
                swaps_blocks=False),
    FamilyFacts("flux1", "FLUX.1", ("FluxPipeline",), 1024, 3.5, "flux1", "flux-1-dev/lora", text_encoders="clip+t5",
                speed_group="FLUX"),
    FamilyFacts("flux2", "FLUX.2 klein", ("Flux2KleinPipeline",), 1024, 4.0, "flux2_klein", "flux-2-klein/lora",
                text_encoders="qwen3", speed_group="FLUX"),
    # Wan2.2 saves the same pipeline classes as 2.1: wan_family_of_index tells them apart
    FamilyFacts("wan21", "Wan2.1", ("WanPipeline", "WanImageToVideoPipeline"), 960, 5.0,
                "wan2.1", "wan2.1-t2v/lora", text_encoders="umt5", is_video=True,
                speed_group="Wan"),
    FamilyFacts("wan22", "Wan2.2", ("WanPipeline", "WanImageToVideoPipeline"), 960, 5.0,
                "wan2.2", "wan2.2-t2v/lora", text_encoders="umt5", is_video=True,
                speed_group="Wan"),
    # Z-Image and Qwen-Image: ss_base_model_version and modelspec.architecture as musubi-tuner writes them
    # (dataset/architectures.py ARCHITECTURE_Z_IMAGE_FULL "z_image" / ARCHITECTURE_QWEN_IMAGE_FULL "qwen_image";
    # utils/sai_model_spec.py ARCH_Z_IMAGE "Z-Image", ARCH_QWEN_IMAGE "Qwen-Image", + "/lora"). Guidance: the
    # pipelines' own defaults (ZImagePipeline guidance_scale 5.0; QwenImagePipeline true_cfg_scale 4.0). Resolution:
    # the LoRA recipes' 1024 (musubi-tuner docs/qwen_image.md measures at 1024x1024; Qwen-Image's own 1328 px is not
    # a multiple of 64, so buckets are made from 1024).
    FamilyFacts("zimage", "Z-Image", ("ZImagePipeline",), 1024, 5.0, "z_image", "Z-Image/lora",
                text_encoders="qwen3", speed_group="Z-Image"),
    # HunyuanVideo 1.5: musubi-tuner's names (dataset/architectures.py ARCHITECTURE_HUNYUAN_VIDEO_1_5_FULL
    # "hunyuan_video_1_5"; utils/sai_model_spec.py ARCH_HUNYUAN_VIDEO_1_5 "hunyuan-video-1.5"); guidance 6.0, the
    # CFG guider scale of tencent/HunyuanVideo-1.5's 480p/720p T2V recipes as the diffusers docs give it
    FamilyFacts("hunyuanvideo15", "HunyuanVideo 1.5", ("HunyuanVideo15Pipeline",), 960, 6.0, "hunyuan_video_1_5",
                "hunyuan-video-1.5/lora", text_encoders="qwen2.5-vl+byt5", is_video=True,
                speed_group="HunyuanVideo"),
    FamilyFacts("qwenimage", "Qwen-Image", ("QwenImagePipeline",), 1024, 4.0, "qwen_image", "Qwen-Image/lora",
                text_encoders="qwen2.5-vl", speed_group="Qwen-Image"),
)

FAMILIES: MappingProxyType[str, FamilyFacts] = MappingProxyType({f.name: f for f in _ROWS})
NAMES: tuple[str, ...] = tuple(FAMILIES)
#: The family whose data rules apply where a spec says ``family: auto`` and nothing names the model's
#: family (a data check before any model is known, the dashboard's extra data folders): SDXL, the
#: guides' first job (an object LoRA on SDXL at 1024 px).
DEFAULT_IMAGE_FAMILY = "sdxl"
IMAGE_ONLY: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if not f.is_video)
VIDEO: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.is_video)
SPEED_GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.speed_group for f in _ROWS))

#: What lorapod's own engine can do per family, for the planner (``plan/vram.py`` make_fit asks before it
#: suggests a change, so an OOM hint never names one the engine ignores): ``block_swap`` (train.blocks_to_swap)
#: and ``fp8`` (model.dtype fp8: the blocks' frozen linears stored in float8; the GPU's own arch is the
#: planner's to check, engine/device.py refuses below sm 8.9).
ENGINE_FEATURES = ("block_swap", "fp8")


def engine_supports(family: str, feature: str) -> bool:
    """Whether lorapod's engine does ``feature`` (one of ENGINE_FEATURES) for ``family``; an LLM or an
    unknown family: False (the LLM engine's features are the planner's framework profile)."""
    if feature not in ENGINE_FEATURES:
        raise ValueError(f"unknown engine feature {feature!r}: one of {ENGINE_FEATURES}")
    row = FAMILIES.get(family)
    if row is None:
        return False
    return row.swaps_blocks if feature == "block_swap" else True

# Pipeline classes of models lorapod recognises but does not train, so planner and engine refuse
# them by the same name. Flux2Pipeline is FLUX.2 [dev]: diffusers' pipeline_flux2.py loads it with
# a Mistral3ForConditionalGeneration text encoder (its docstring example: from_pretrained(
# "black-forest-labs/FLUX.2-dev")), while FLUX.2 [klein] is Flux2KleinPipeline with a Qwen3
# encoder (pipeline_flux2_klein.py, "black-forest-labs/FLUX.2-klein-base-9B"); a folder whose
# model_index.json says Flux2Pipeline is therefore dev (32B), never klein.
#
# Qwen-Image-Edit (QwenImageEditPipeline, and Edit-2509/2511 as QwenImageEditPlusPipeline) trains on pairs of
# a control image and a target (musubi-tuner docs/qwen_image.md, --model_version edit*), which lorapod's image
# data does not carry: named here so a folder of it is refused as what it is, not as "unknown".
NOT_TRAINED: MappingProxyType[str, str] = MappingProxyType({
    "Flux2Pipeline": "flux2-dev",
    "StableDiffusion3Pipeline": "sd3",
    "QwenImageEditPipeline": "qwenimage-edit",
    "QwenImageEditPlusPipeline": "qwenimage-edit",
})

# a pipeline class that one row alone claims names that row; Wan's two rows share theirs (wan_family_of_index)
_CLAIMS = [p for f in _ROWS for p in f.pipelines]
_BY_PIPELINE = {p: f.name for f in _ROWS for p in f.pipelines if _CLAIMS.count(p) == 1}


def facts(name: str) -> FamilyFacts:
    """The row of family ``name``; SpecError naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise SpecError(f"unknown diffusion family {name!r}", hint=f"use one of: {', '.join(NAMES)}") from None


def family_of_index(raw: dict[str, Any]) -> str | None:
    """The family a diffusers ``model_index.json`` names: one of NAMES, a NOT_TRAINED name, or None.

    The planner and the engine both read a folder's family through here, so they cannot disagree.
    """
    cls = raw.get("_class_name", "")
    wan = wan_family_of_index(raw)
    if wan:
        return wan
    return _BY_PIPELINE.get(cls) or NOT_TRAINED.get(cls)


def wan_family_of_index(raw: dict[str, Any]) -> str | None:
    """wan21 / wan22 from a Wan pipeline's model_index.json (a second transformer or a boundary means 2.2)."""
    if raw.get("_class_name") not in FAMILIES["wan21"].pipelines:  # T2V, I2V
        return None
    t2 = raw.get("transformer_2")
    has_t2 = isinstance(t2, list) and t2[0] is not None
    return "wan22" if has_t2 or raw.get("boundary_ratio") is not None or raw.get("expand_timesteps") else "wan21"


def of_base_version(version: str) -> str | None:
    """The family whose kohya ``ss_base_model_version`` is ``version`` (what ``lorapod inspect`` reads)."""
    return next((f.name for f in _ROWS if f.kohya_base_version == version), None)
