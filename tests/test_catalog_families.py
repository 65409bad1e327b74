"""The one family table (catalog/families.py) and everything that must agree with it.

A family added to the table and not to one of the places that implement it (the engine's
class, kohya's key layout, the planner's catalog rows), or the other way round, fails here.
"""

from __future__ import annotations

import typing
from dataclasses import FrozenInstanceError

import pytest

from lorapod.catalog import families
from lorapod.catalog.families import FAMILIES, FamilyFacts


def test_the_table_is_built_once_and_cannot_be_changed_afterwards():
    with pytest.raises(TypeError):
        FAMILIES["sd3"] = FAMILIES["sd15"]  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        FAMILIES["sd15"].resolution = 768  # type: ignore[misc]
    assert all(isinstance(f, FamilyFacts) and f.name == name for name, f in FAMILIES.items())


def test_every_row_has_an_engine_family_and_every_engine_family_a_row():
    from lorapod.engine.diffusion.families import FAMILIES as ENGINE

    assert list(ENGINE) == list(FAMILIES)
    for name, cls in ENGINE.items():
        assert cls.name == name
        assert cls.pipeline_class in FAMILIES[name].pipelines, name
        assert bool(getattr(cls, "video", False)) == FAMILIES[name].is_video, name
        assert cls.flow == FAMILIES[name].flow, name


def test_every_external_trainer_names_only_the_tables_families():
    from lorapod import trainers
    from lorapod.trainers import ai_toolkit, sd_scripts

    for name in trainers.names():
        assert set(trainers.get(name).families) <= {"llm", *FAMILIES}, name
    assert set(sd_scripts.SCRIPTS) == set(sd_scripts.SdScripts.families)
    assert set(ai_toolkit.ARCH) | {"flux2"} == set(ai_toolkit.AiToolkit.families)  # klein: its own KLEIN table


def test_every_row_has_a_kohya_layout_and_metadata_names():
    from lorapod.export.kohya import LAYOUTS

    assert set(LAYOUTS) == set(FAMILIES)
    versions = [f.kohya_base_version for f in FAMILIES.values()]
    assert len(set(versions)) == len(versions)  # lorapod inspect reads the family back from it
    assert all(families.of_base_version(f.kohya_base_version) == n for n, f in FAMILIES.items())
    assert all(f.modelspec_architecture.endswith("/lora") for f in FAMILIES.values())


def test_every_row_has_a_bucket_rule_and_catalog_models_to_plan():
    from lorapod.catalog.models import load_models
    from lorapod.data.buckets import make_buckets

    _, images, _ = load_models()
    planned = {m.family for m in images}
    for name, f in FAMILIES.items():
        assert f.resolution % 64 == 0 and make_buckets(f.resolution), name
        assert name in planned, f"{name} has no row in catalog/data/models.yaml"
        assert all(m.is_video == f.is_video for m in images if m.family == name), name
    assert planned <= set(FAMILIES)


def test_the_spec_and_the_commands_take_exactly_the_tables_families():
    from lorapod.cli import data as cli_data
    from lorapod.spec import Family
    from lorapod.ui import views

    assert typing.get_args(Family) == ("auto", "llm", *FAMILIES)
    assert cli_data.FAMILIES.split("|") == list(FAMILIES) and tuple(views.FAMILIES) == tuple(FAMILIES)


@pytest.mark.parametrize(("index", "family"), [
    ({"_class_name": "StableDiffusionXLPipeline"}, "sdxl"),
    ({"_class_name": "Flux2KleinPipeline"}, "flux2"),
    ({"_class_name": "WanPipeline", "transformer_2": [None, None]}, "wan21"),
    ({"_class_name": "WanPipeline", "transformer_2": ["diffusers", "WanTransformer3DModel"]}, "wan22"),
    ({"_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9}, "wan22"),
    ({"_class_name": "StableDiffusion3Pipeline"}, "sd3"),  # known, not trained
    ({"_class_name": "KandinskyPipeline"}, None),
])
def test_a_pipeline_class_names_one_family(index, family):
    assert families.family_of_index(index) == family


def test_a_flux2pipeline_folder_is_flux2_dev_for_planner_and_engine_alike(tmp_path):
    """diffusers' own sources decide it: pipeline_flux2.py (``Flux2Pipeline``) loads a
    Mistral3ForConditionalGeneration text encoder and its example is ``Flux2Pipeline.from_pretrained(
    "black-forest-labs/FLUX.2-dev")``; FLUX.2 [klein] is pipeline_flux2_klein.py (``Flux2KleinPipeline``,
    a Qwen3 encoder, ``"black-forest-labs/FLUX.2-klein-base-9B"``). So a Flux2Pipeline folder is the 32B
    [dev] model, which lorapod does not train: the planner must not plan it as klein, and both say so."""
    import json

    from lorapod.catalog.models import find_model
    from lorapod.engine.diffusion.families import detect, resolve_family
    from lorapod.errors import ModelLoadError, PlanError

    folder = tmp_path / "flux2"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
    assert families.family_of_index({"_class_name": "Flux2Pipeline"}) == "flux2-dev"
    assert detect(str(folder))[0] == "flux2-dev"
    for family in ("auto", "flux2"):
        with pytest.raises(PlanError, match="Flux2Pipeline model \\(family flux2-dev\\)") as exc:
            find_model(str(folder), family)
        assert "klein" in exc.value.hint
        with pytest.raises(ModelLoadError, match="is a Flux2Pipeline"):
            resolve_family(family, str(folder))
    # a klein folder plans and trains as flux2
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline"}))
    assert find_model(str(folder)).family == "flux2" and detect(str(folder))[0] == "flux2"


# ----------------------------------------------------------------------------- family names outside

# Where a family's name (or a prefix of it in a ``startswith``) may be written outside the catalog and
# the engine's families package, and why. The list only shrinks: docs/architecture.md's "To add a family"
# needs none of these, and a family whose code is one folder (engine/diffusion/families/<name>/) may be
# spelled in none of them but the external trainers' vocabulary.
FAMILY_NAMES_OUTSIDE: dict[str, str] = {
    "lorapod/export/inspect.py": "the ComfyUI name rules of the families written before the folders; move: "
                                 "Family.comfy_unet / inspect_signature, as Z-Image's and Qwen-Image's are",
    "lorapod/plan/counted_models.py": "the architectures the planner's figures are counted on, per family; move: "
                                      "an arch module in each family's folder",
    "lorapod/builtin/wan.py": "the tiny Wan pipelines the tests and the video demo build; move: the Wan folder's tiny.py",
    "lorapod/demo_image.py": "the image demo trains one named family (SD 1.5's toy)",
    "lorapod/demo_video.py": "the video demo trains one named family (Wan2.1's toy)",
    "lorapod/evaluate/images.py": "SD pipelines take a negative prompt string; move: ask the family's sample_kwargs",
    "lorapod/trainers/": "each external trainer's own name for each of the table's families (its vocabulary)",
}


def family_names_outside(src=None) -> dict[str, tuple[int, set[str]]]:
    """Modules outside catalog/ and engine/diffusion/families/ with a string that is a family's name,
    or a prefix of one passed to ``startswith`` (``name.startswith("flux")``): first line and names."""
    import ast
    from pathlib import Path

    src = src or Path(__file__).resolve().parents[1] / "src"
    names = set(FAMILIES)
    out: dict[str, tuple[int, set[str]]] = {}
    for path in sorted((src / "lorapod").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(("lorapod/catalog/", "lorapod/engine/diffusion/families/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found: set[str] = set()
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.add(node.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
                for a in node.args:
                    for c in [a, *getattr(a, "elts", [])]:
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and len(c.value) >= 2:
                            found |= {n for n in names if n.startswith(c.value)}
            if found:
                line, had = out.get(rel, (node.lineno, set()))
                out[rel] = (min(line, node.lineno), had | found)
    return out


def _listed(rel: str) -> str | None:
    return next((k for k in FAMILY_NAMES_OUTSIDE if rel == k or (k.endswith("/") and rel.startswith(k))), None)


def test_family_names_appear_outside_the_catalog_and_the_families_only_where_listed():
    from pathlib import Path

    found = family_names_outside()
    unlisted = {f"{rel}:{line} {sorted(n)}" for rel, (line, n) in found.items() if _listed(rel) is None}
    assert not unlisted, f"a family's name outside the catalog and engine/diffusion/families/: {sorted(unlisted)}; " \
                         "move the decision into the family (a method or attribute of its class) or the catalog's row"
    stale = {k for k in FAMILY_NAMES_OUTSIDE if not any(_listed(rel) == k for rel in found)}
    assert not stale, f"no family name left in {sorted(stale)}: take it off FAMILY_NAMES_OUTSIDE"
    folders = Path(__file__).resolve().parents[1] / "src" / "lorapod" / "engine" / "diffusion" / "families"
    foldered = {d.name for d in folders.iterdir() if (d / "__init__.py").is_file()}
    assert {"zimage", "qwenimage"} <= foldered
    leaks = {f"{rel}: {sorted(n & foldered)}" for rel, (_, n) in found.items()
             if n & foldered and _listed(rel) != "lorapod/trainers/"}
    assert not leaks, f"a family whose code is one folder is spelled outside it: {sorted(leaks)}"


def test_the_name_check_catches_a_name_and_a_prefix(tmp_path):
    pkg = tmp_path / "lorapod" / "plan"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f(m):\n    return m.family == 'qwenimage' or m.family.startswith('fl')\n")
    assert family_names_outside(tmp_path) == {"lorapod/plan/x.py": (2, {"qwenimage", "flux1", "flux2"})}


def test_the_engine_capabilities_the_planner_reads_are_the_engines():
    from lorapod.engine.diffusion.families import FAMILIES as ENGINE

    for name, cls in ENGINE.items():
        assert families.engine_supports(name, "block_swap") == bool(cls.block_lists), name
        assert families.engine_supports(name, "fp8")
    assert not families.engine_supports("llm", "block_swap")
    with pytest.raises(ValueError, match="unknown engine feature"):
        families.engine_supports("sdxl", "teleport")
