"""The trainer registry: classes, one registration each, and every name a user reads comes from it.

As compute providers (compute/provider.py ``register(name, cls)``): the built-ins are listed once in
``trainers.BUILTINS``, a plugin registers its class, and the CLI's ``--trainer`` help, the unknown-
trainer hint and ``lorapod import``'s dispatch read the registry, so a new trainer is one module and
one line (docs/architecture.md; the 2026-12-05 design review's §4C counted nine places).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lorapod import trainers
from lorapod.catalog.trainers import load_trainers, trainer_aliases
from lorapod.errors import SpecError
from lorapod.trainers.base import Layout, Trainer
from lorapod.trainers.import_result import ImportResult
from lorapod.trainers.importer import import_file
from lorapod.trainers.job import TrainerJob

SRC = Path(__file__).resolve().parents[1] / "src" / "lorapod"


class OneTrainerLike(Trainer):
    """A plugin as a third party would write it (the smallest complete adapter: it builds a job and
    reads its own config back); registered and removed by the fixture below."""

    name = "onetrainer-test"
    title = "OneTrainer (test plugin)"
    families = ("sdxl",)
    contract = "none"
    config_kind = "a OneTrainer config (.onetrainer)"

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        return TrainerJob(self.name, {}, [], [], layout.out, "lora", [])

    @classmethod
    def reads_config(cls, path: Path, cfg: Any) -> bool:
        return path.suffix == ".onetrainer"

    def import_config(self, cfg: Any, flags: str = "") -> ImportResult:
        r = ImportResult(self.name)
        r.put("model.id", cfg["base"])
        return r


@pytest.fixture
def plugin():
    trainers.register(OneTrainerLike.name, OneTrainerLike)
    yield OneTrainerLike
    trainers._REGISTRY.pop(OneTrainerLike.name, None)


def test_every_builtin_is_a_trainer_class_under_its_own_name():
    for name in trainers.BUILTINS:
        cls = trainers.trainer_class(name)
        assert isinstance(cls, type) and issubclass(cls, Trainer) and cls.name == name
    assert set(load_trainers()["trainers"]) == set(trainers.BUILTINS)  # each has its plan profile
    assert set(trainer_aliases().values()) <= set(trainers.BUILTINS)


def test_register_refuses_a_second_name_a_non_trainer_and_a_misnamed_class(plugin):
    with pytest.raises(ValueError, match="already registered"):
        trainers.register(plugin.name, plugin)
    with pytest.raises(ValueError, match="already registered"):
        trainers.register("kohya", type("Kohya", (OneTrainerLike,), {"name": "kohya"}))  # an alias
    with pytest.raises(ValueError, match="derived from"):
        trainers.register("x", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is named"):
        trainers.register("other-name", OneTrainerLike)


def test_a_registered_plugin_is_offered_everywhere_a_trainer_is_named(plugin, tmp_path):
    from lorapod.cli.main import build_app

    assert trainers.get("OneTrainer-Test").title == plugin.title and plugin.name in trainers.names()
    with pytest.raises(SpecError) as err:
        trainers.canonical("simpletuner")
    assert plugin.name in (err.value.hint or "")
    app = build_app()
    for command in ("train", "run", "plan"):
        out = CliRunner().invoke(app, [command, "--help"], terminal_width=400).output
        assert plugin.name in " ".join(out.split()), command
    cfg = tmp_path / "mine.onetrainer"
    cfg.write_text("base: org/model\n")
    assert import_file(cfg).spec == {"model": {"id": "org/model"}}
    other = tmp_path / "x.yaml"
    other.write_text("a: 1\n")
    with pytest.raises(SpecError, match="a OneTrainer config"):
        import_file(other)


def test_no_list_of_trainers_is_typed_in_the_cli():
    """The five help strings the review found (cli/run.py, train.py x2, trainers.py, plan.py) and
    ``lorapod import``'s read the registry now; a list typed again would miss the next trainer. (One
    name alone may stay: ``eval --prompts`` takes sd-scripts' prompt options, a syntax.)"""
    typed = re.compile("|".join(re.escape(n) for n in trainers.BUILTINS))
    hits = [f"{p.relative_to(SRC)}:{i}" for p in sorted((SRC / "cli").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(typed.findall(line)) > 1]
    assert hits == []
