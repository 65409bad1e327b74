"""External trainers lorapod drives from a spec: one class per trainer, one registry.

``get("sd-scripts")`` returns the adapter; each turns a JobSpec into the trainer's files and
command lines (:class:`~lorapod.trainers.job.TrainerJob`), refuses what it cannot honour before
anything is rented, bridges the trainer's progress into ``metrics.jsonl``, maps its samples and
checkpoints into the run folder (:mod:`lorapod.trainers.runner`), and reads its own configs back
for ``lorapod import`` (:meth:`~lorapod.trainers.base.Trainer.import_config`).

Registered as compute providers are (``compute/provider.py``): the built-ins by ``module:Class`` in
:data:`BUILTINS`, imported on first use, and anything else by :func:`register` with its class. Both
are looked up alike, and every list of trainer names a user sees (the CLI's ``--trainer`` help,
the "unknown trainer" hint) is read from here, so adding OneTrainer or SimpleTuner is one module
(a :class:`~lorapod.trainers.base.Trainer` subclass) and one line. This module imports nothing
heavy at the top: the CLI reads :func:`hint` while it builds its help, before any command runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from lorapod.errors import SpecError

if TYPE_CHECKING:
    from lorapod.rundir import RunDir
    from lorapod.trainers.base import Layout, Trainer
    from lorapod.trainers.job import TrainerJob

#: The built-in trainers, imported only when first used (:func:`trainer_class`).
BUILTINS: dict[str, str] = {
    "sd-scripts": "lorapod.trainers.sd_scripts:SdScripts",
    "ai-toolkit": "lorapod.trainers.ai_toolkit:AiToolkit",
    "musubi-tuner": "lorapod.trainers.musubi:MusubiTuner",
    "axolotl": "lorapod.trainers.axolotl:Axolotl",
}
_REGISTRY: dict[str, type[Trainer]] = {}


def register(name: str, cls: type[Trainer]) -> None:
    """Add a trainer class under ``name`` (its ``name`` attribute), as :data:`BUILTINS` names
    theirs. A second registration of a name, a built-in's or an alias, is refused, so a plugin can
    never silently replace the trainer a run folder records."""
    from lorapod.trainers.base import Trainer

    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        raise ValueError(f"trainer {name!r} must be a class derived from lorapod.trainers.base.Trainer")
    if getattr(cls, "name", None) != name:
        raise ValueError(f"trainer class {cls.__name__} is named {getattr(cls, 'name', None)!r}, not {name!r}")
    if name in _REGISTRY or name in BUILTINS or name in _aliases():
        raise ValueError(f"a trainer named {name!r} is already registered")
    _REGISTRY[name] = cls


def names() -> list[str]:
    """Every registered trainer, built-ins first."""
    return [*BUILTINS, *_REGISTRY]


def hint() -> str:
    """What ``--trainer`` takes, for help texts and hints."""
    return " | ".join(names())


def _aliases() -> dict[str, str]:
    # catalog/data/trainers.yaml, shared with the planner's trainer profiles (read on first use)
    from lorapod.catalog.trainers import trainer_aliases

    return trainer_aliases()


def canonical(name: str) -> str:
    """The registered name of ``name`` or one of its aliases (``kohya`` -> ``sd-scripts``)."""
    key = name.strip().lower()
    key = _aliases().get(key, key)
    if key not in BUILTINS and key not in _REGISTRY:
        raise SpecError(f"unknown trainer {name!r}", hint=f"--trainer {hint()}")
    return key


def trainer_class(name: str) -> type[Trainer]:
    """The class registered as ``name`` (or an alias of it), built-in or plugin."""
    key = canonical(name)
    if key in _REGISTRY:
        return _REGISTRY[key]
    module, _, cls = BUILTINS[key].partition(":")
    found: type[Trainer] = getattr(importlib.import_module(module), cls)
    return found


def get(name: str) -> Trainer:
    return trainer_class(name)()


def classes() -> list[type[Trainer]]:
    """Every registered trainer's class (imports the built-ins)."""
    return [trainer_class(n) for n in names()]


def for_resume(run: RunDir, given: str | None, where: str, say: Callable[[str], None]) -> str | None:
    """The trainer a resumed run continues with: the one it was started with (its run folder's
    ``trainer.json``), so ``--resume`` alone never hands another trainer's checkpoints to
    lorapod's engine; a different ``--trainer`` is refused."""
    recorded = run.recorded_trainer()
    if recorded is not None and given is None:
        say(f"continuing with {recorded}, the trainer {where} was started with")
    if given is None or recorded is None:
        return recorded if given is None else canonical(given)
    if canonical(given) != canonical(recorded):
        raise SpecError(f"{where} was started with --trainer {recorded}, not {given}",
                        hint=f"resume it with --trainer {recorded} (or without --trainer), or start a new run")
    return canonical(recorded)


def prepare(spec, name: str, layout: Layout, *, images: int | None = None) -> tuple[Trainer, TrainerJob]:
    """Refuse what the trainer cannot do, build its job, check it against the contract."""
    from lorapod.trainers.base import refuse_all

    trainer = get(name)
    refuse_all(trainer, spec)
    job = trainer.build(spec, layout, images=images)
    trainer.check(job)
    return trainer, job


__all__ = ["BUILTINS", "canonical", "classes", "for_resume", "get", "hint", "names", "prepare", "register",
           "trainer_class"]
