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
