"""External trainers lorapod drives from a spec: one adapter per trainer, one registry.

``get("sd-scripts")`` returns the adapter; each turns a JobSpec into the trainer's files and
command lines (:class:`~lorapod.trainers.job.TrainerJob`), refuses what it cannot honour before
anything is rented, bridges the trainer's progress into ``metrics.jsonl`` and maps its samples
and checkpoints into the run folder (:mod:`lorapod.trainers.runner`). Names are registered once,
like compute providers and captioners; aliases are accepted on the command line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from lorapod.catalog.trainers import trainer_aliases
from lorapod.errors import SpecError
from lorapod.trainers.base import Layout, Trainer, refuse_all
from lorapod.trainers.job import TrainerJob, TrainerRefused

if TYPE_CHECKING:
    from lorapod.rundir import RunDir

_REGISTRY: dict[str, str] = {
    "sd-scripts": "lorapod.trainers.sd_scripts:SdScripts",
    "ai-toolkit": "lorapod.trainers.ai_toolkit:AiToolkit",
    "musubi-tuner": "lorapod.trainers.musubi:MusubiTuner",
    "axolotl": "lorapod.trainers.axolotl:Axolotl",
}
# Other accepted names (catalog/data/trainers.yaml, shared with the planner's trainer profiles).
ALIASES = trainer_aliases()


def names() -> list[str]:
    return list(_REGISTRY)


def register(name: str, target: str) -> None:
    """Add an adapter (``module:Class``); a name can be registered once."""
    if name in _REGISTRY or name in ALIASES:
        raise ValueError(f"a trainer named {name!r} is already registered")
    _REGISTRY[name] = target


def canonical(name: str) -> str:
    """The registered name of ``name`` or one of its aliases (``kohya`` -> ``sd-scripts``)."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in _REGISTRY:
        raise SpecError(f"unknown trainer {name!r}", hint=f"--trainer {' | '.join(_REGISTRY)}")
    return key


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


def get(name: str) -> Trainer:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in _REGISTRY:
        raise SpecError(f"unknown trainer {name!r}", hint=f"--trainer {' | '.join(_REGISTRY)}")
    module, cls = _REGISTRY[key].split(":")
    return getattr(importlib.import_module(module), cls)()


def prepare(spec, name: str, layout: Layout, *, images: int | None = None) -> tuple[Trainer, TrainerJob]:
    """Refuse what the trainer cannot do, build its job, check it against the contract."""
    trainer = get(name)
    refuse_all(trainer, spec)
    job = trainer.build(spec, layout, images=images)
    trainer.check(job)
    return trainer, job


__all__ = ["ALIASES", "Layout", "Trainer", "TrainerJob", "TrainerRefused", "get", "names", "prepare", "register"]
