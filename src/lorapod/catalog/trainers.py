"""The external trainers' packaged facts (data/trainers.yaml): the other names users call them by,
and what each adds to a plan (setup time, image, VRAM overhead).

One file for both, so the planner (plan/trainer_profile.py) and the trainer registry
(lorapod.trainers) read the same aliases from below them and the planner never imports the
trainers' code.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


@cache
def load_trainers() -> dict[str, Any]:
    """The whole of ``data/trainers.yaml`` (``boot_min``, ``aliases``, ``trainers``)."""
    text = resources.files("lorapod.catalog").joinpath("data", "trainers.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def trainer_aliases() -> dict[str, str]:
    """Each accepted alias -> the trainer's registered name (``kohya`` -> ``sd-scripts``)."""
    return dict(load_trainers()["aliases"])
