"""What fits advice offers must be something the job's trainer does and its GPU runs (review N5):
block swap only for models whose blocks the trainer swaps (lorapod's engine: the DiT families,
FLUX and Wan among them, not the SD U-Nets), fp8 base weights only on GPUs with fp8 tensor cores (compute capability >= 8.9). The same
holds for the planner's table, for the out-of-memory hint, and before renting."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import yaml

from lorapod.catalog.models import find_model
from lorapod.compute.offers import planned_job
from lorapod.compute.preflight import PreflightError, preflight
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.engine import loop
from lorapod.plan.frameworks import framework
from lorapod.plan.vram import Settings, arch_of, make_fit, model_kind
from lorapod.spec import load_spec

FLUX = find_model("black-forest-labs/FLUX.1-dev", "flux1")
SDXL = find_model("stabilityai/stable-diffusion-xl-base-1.0", "sdxl")
WAN14B = find_model("Wan-AI/Wan2.1-T2V-14B", "wan2.1")
FLUX_1024 = Settings(base_dtype="bf16", r=16, targets="all", optimizer="adamw", gradient_checkpointing=False,
                     batch=1, resolution=1024)


def sets(fix) -> str:
    return " ".join(fix.sets) if fix else ""


def test_block_swap_is_offered_only_where_the_trainer_swaps_that_models_blocks():
    # lorapod's engine swaps a DiT's blocks (engine/diffusion/memory.py), not a U-Net's: SDXL on 6 GB
    # gets no "block swap" advice, FLUX on 12 GB does
    assert model_kind(FLUX) == "image" and framework("lorapod").swaps_blocks("image", "flux1")
    assert not framework("lorapod").swaps_blocks("image", "sdxl")
    sdxl = Settings(base_dtype="bf16", r=16, targets="all", optimizer="adamw", gradient_checkpointing=False,
                    batch=1, resolution=1024)
    assert "blocks_to_swap" not in sets(make_fit(SDXL, sdxl, 6.0))
    assert "train.blocks_to_swap=" in sets(make_fit(FLUX, FLUX_1024, 12.0))
    # diffusers' own scripts swap nothing: the same FLUX job there is never told to swap
    assert "blocks_to_swap" not in sets(make_fit(FLUX, replace(FLUX_1024, framework="diffusers"), 12.0))
    # sd-scripts' flux_train_network.py swaps FLUX blocks: there it is the answer
    kohya = make_fit(FLUX, replace(FLUX_1024, framework="sd-scripts"), 12.0)
    assert kohya is not None and "train.blocks_to_swap=" in sets(kohya)
    # Wan video on lorapod's engine (video.py swaps its blocks): still offered
    wan = Settings(base_dtype="bf16", r=16, targets="all", optimizer="adamw", gradient_checkpointing=True, batch=1,
                   resolution=480, frames=81)
    assert model_kind(WAN14B) == "video"
    assert "train.blocks_to_swap=" in sets(make_fit(WAN14B, wan, 24.0))


@pytest.mark.parametrize("capability,arch,fp8", [((8, 6), "ampere", False), ((8, 0), "ampere", False),
                                                  ((7, 5), "turing", False), ((8, 9), "ada", True),
                                                  ((9, 0), "hopper", True), ((12, 0), "blackwell", True)])
def test_fp8_is_offered_only_on_gpus_that_run_it(capability, arch, fp8):
    assert arch_of(capability) == arch
    fix = make_fit(FLUX, FLUX_1024, 24.0, arch)
    assert ("model.dtype=fp8" in sets(fix)) is fp8, fix
    assert "model.dtype=fp8" in sets(make_fit(FLUX, FLUX_1024, 24.0))  # GPU not known yet: the planner may offer it


def _flux_spec(tmp_path, model=("black-forest-labs/FLUX.1-dev", "flux1"), **train):
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "flux.yaml"
    path.write_text(yaml.safe_dump({"model": {"id": model[0], "family": model[1]},
                                    "data": {"path": str(data), "resolution": 1024},
                                    "train": {"gradient_checkpointing": False, **train},
                                    "output": {"dir": str(tmp_path / "runs")}}))
    return load_spec(path)


def test_the_oom_hint_on_an_ampere_card_never_offers_fp8(tmp_path, monkeypatch):
    """An RTX 3090 (sm 8.6, 24 GB) running FLUX out of memory: the hint was 'gradient checkpointing +
    fp8 base weights', and the resumed run then failed in resolve_precision (fp8 needs sm 8.9)."""
    spec = _flux_spec(tmp_path)
    monkeypatch.setattr(loop, "device_memory_gb", lambda device: 23.6)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    err = loop.out_of_memory(spec, tmp_path / "run", torch.device("cuda", 0), 3, tmp_path / "run/checkpoints/step-3",
                             23.2)
    assert "fp8" not in err.hint, err.hint
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))  # an RTX 4090
    err = loop.out_of_memory(spec, tmp_path / "run", torch.device("cuda", 0), 3, tmp_path / "run/checkpoints/step-3",
                             23.2)
    assert "--set model.dtype=fp8" in err.hint, err.hint


def test_block_swap_on_a_unet_is_refused_before_renting(tmp_path):
    spec = _flux_spec(tmp_path, ("stabilityai/stable-diffusion-xl-base-1.0", "sdxl"), blocks_to_swap=20)
    with pytest.raises(PreflightError) as err:
        preflight(spec, RunPodProvider(api=object()), planned_job(spec), env={"HF_HUB_OFFLINE": "1"})
    assert "no transformer blocks" in err.value.message
    assert "train.blocks_to_swap: 0" in (err.value.hint or "")
