"""How an external trainer changes a plan: its setup time and its VRAM extras.

Kept apart from the planner's speed and VRAM models on purpose: ``plan_job(trainer=...)`` only
moves the job's "boot + install" phase to the instance's boot plus the trainer's setup (unless
the spec fixes ``compute.phases.boot_min``) and adds the trainer's overhead to the VRAM peak.
Figures are in ``catalog/data/trainers.yaml``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from lorapod.catalog.trainers import load_trainers, trainer_aliases
from lorapod.errors import PlanError

if TYPE_CHECKING:
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec


def profiles() -> dict:
    return load_trainers()


def profile(name: str) -> dict:
    key = trainer_aliases().get(name, name)
    found = profiles()["trainers"].get(key)
    if found is None:
        raise PlanError(f"no plan profile for trainer {name!r}", hint=f"known: {', '.join(profiles()['trainers'])}")
    return found


def with_trainer(spec: JobSpec, name: str) -> JobSpec:
    """The spec as the planner should see it when ``name`` runs it (a copy)."""
    p = profile(name)
    spec = spec.model_copy(deep=True)
    if spec.compute.phases.boot_min is None:
        spec.compute.phases.boot_min = profiles()["boot_min"] + p["setup_min"]
    return spec


def add_overhead(job: Job, name: str) -> Job:
    est = job.estimate
    extra = float(profile(name)["vram_overhead_gb"])
    parts = {**est.parts, f"{name} overhead": extra}
    job.estimate = dataclasses.replace(est, peak_gb=round(est.peak_gb + extra, 2), parts=parts)
    job.warnings.append(f"runs under {name} on {profile(name)['image']}: setup {profile(name)['setup_min']:g} min, "
                        f"+{extra:g} GB VRAM")
    return job
