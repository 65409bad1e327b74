"""docs/architecture.md's "To add a diffusion family" against the code: every path, class, field
and method the checklist names exists, and every family that lives in its own folder has each step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Families whose transformer cannot be counted on the meta device (their models.yaml rows say how their
# figures were made instead)
NOT_COUNTED = {"hunyuanvideo15": "HunyuanVideo15Transformer3DModel.forward branches on torch.all(image_embeds == 0)"}
SRC = ROOT / "src" / "lorapod"


def checklist() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("## To add a diffusion family")
    rest = text[start + 3 :]
    end = rest.find("\n## ")
    return rest if end < 0 else rest[:end]


def named() -> set[str]:
    return set(re.findall(r"`([^`]+)`", checklist()))


def test_every_path_the_checklist_names_exists():
    paths = {n for n in named() if "/" in n and "<name>" not in n}
    assert paths, "the checklist names no file"
    for p in paths:
        path = p.split(":")[0]
        assert (SRC / path).exists() or (ROOT / path).exists(), p


def test_every_field_and_method_the_checklist_names_is_the_codes():
    from lorapod.catalog.families import FamilyFacts, engine_supports
    from lorapod.catalog.models import ImageModel
    from lorapod.engine.diffusion.families.base import Family

    fields = {f.name for c in (FamilyFacts, ImageModel) for f in dataclasses.fields(c)}
    words = {n for n in named() if re.fullmatch(r"[a-z_]+", n)}
    for w in words:
        assert w in fields or hasattr(Family, w) or w in (engine_supports.__name__, "dit"), w
    assert {"kohya_rules", "block_lists", "comfy_unet", "speed_group", "swaps_blocks"} <= words


@pytest.mark.parametrize("name", sorted(d.name for d in (SRC / "engine" / "diffusion" / "families").iterdir()
                                        if (d / "__init__.py").is_file()))
def test_every_family_folder_has_each_step(name):
    import importlib

    from lorapod.catalog.families import FAMILIES as ROWS
    from lorapod.catalog.models import load_models
    from lorapod.engine.diffusion.families import FAMILIES

    assert name in ROWS and name in FAMILIES  # facts and registration
    cls = FAMILIES[name]
    assert cls.__module__ == f"lorapod.engine.diffusion.families.{name}"  # the code is the folder's
    assert cls.kohya_rules is not None and cls.comfy_unet and cls.inspect_signature and cls.block_lists
    assert callable(importlib.import_module(f"lorapod.engine.diffusion.families.{name}.tiny").build)
    if name not in NOT_COUNTED:
        assert callable(importlib.import_module(f"lorapod.engine.diffusion.families.{name}.arch").dit)
    assert any(m.family == name for m in load_models()[1])
    tests = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py"))
    assert f"families.{name} import tiny" in tests or f"families.{name}.tiny" in tests
