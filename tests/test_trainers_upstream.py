"""What the trainers' own code does with lorapod's jobs, one test per place where it disagreed.

Each test states the upstream fact it encodes (file at the pinned commit); tools/upstream_check.py
runs the same jobs through that code itself when the checkouts are present (the ``upstream``
tests at the end), and its ``record`` step writes the fixtures under tests/recorded/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lorapod.spec import load_spec
from lorapod.trainers import Layout, TrainerRefused, prepare

REPO = Path(__file__).resolve().parents[1]


def write_spec(tmp: Path, raw: dict, files=("a.png", "a.txt")) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    for f in files:
        (data / f).parent.mkdir(parents=True, exist_ok=True)
        (data / f).write_bytes(b"")
    base = {"data": {"path": "data", "format": "images"}, "train": {"max_steps": 10},
            "output": {"dir": str(tmp / "runs"), "name": "t"}}
    for key, val in raw.items():
        base.setdefault(key, {}).update(val)
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def refusal(path: Path, trainer: str) -> str:
    with pytest.raises(TrainerRefused) as info:
        prepare(load_spec(path), trainer, Layout("/w"))
    return str(info.value)


# ------------------------------------------------------------------ item 2: FLUX.2 klein's base


def test_ai_toolkit_klein_is_trained_on_the_base_it_loads(tmp_path):
    """flux2_klein_4b downloads flux-2-klein-base-4b.safetensors from name_or_path
    (flux2_klein_model.py); the distilled repo is refused with the base's id, and the example
    names the base."""
    klein = {"id": "black-forest-labs/FLUX.2-klein-4B", "family": "flux2", "variant": "4b"}
    msg = refusal(write_spec(tmp_path, {"model": klein}), "ai-toolkit")
    assert "loads flux-2-klein-base-4b.safetensors" in msg
    assert "--set model.id=black-forest-labs/FLUX.2-klein-base-4B" in msg
    assert load_spec(REPO / "examples" / "flux2-klein-lora.yaml").model.id == "black-forest-labs/FLUX.2-klein-base-4B"


def test_ai_toolkit_klein_samples_with_its_uis_settings_not_sds(tmp_path):
    """SampleConfig defaults guidance 7 / 20 steps (config_modules.py); ai-toolkit's UI writes 4 / 30
    into a klein job (ui/src/helpers/defaultSamples.ts)."""
    klein = {"id": "black-forest-labs/FLUX.2-klein-base-4B", "family": "flux2", "variant": "4b"}
    _, job = prepare(load_spec(write_spec(tmp_path, {"model": klein, "samples": {"prompts": ["a mug"]}})),
                     "ai-toolkit", Layout("/w"))
    sample = job.config["config"]["process"][0]["sample"]
    assert (sample["guidance_scale"], sample["sample_steps"]) == (4.0, 30)
