"""``lorapod import``: an existing trainer config -> a lorapod spec, with every setting that has
no lorapod equivalent reported instead of silently dropped.

Each trainer reads its own configs (:meth:`~lorapod.trainers.base.Trainer.import_config`, in its
module, beside the writer whose vocabulary it inverts): an axolotl YAML, an ai-toolkit job YAML
(``job: extension``), or an sd-scripts dataset TOML plus the training command's options
(``--flags "..."``; the script name in them, e.g. ``sdxl_train_network.py``, gives the model
family). This module finds which trainer a file belongs to; what they share is :mod:`lorapod.trainers.import_result`.
Settings lorapod sets by itself when it drives the trainer (output folders, logging, caching to
disk, save format) are taken as read.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

from lorapod.errors import SpecError
from lorapod.trainers import classes
from lorapod.trainers.import_result import ImportResult


def import_file(path: Path, flags: str = "") -> ImportResult:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path} does not exist", hint="pass a trainer's config file")
    text = path.read_text(encoding="utf-8")
    cfg: Any
    if path.suffix == ".toml":
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{path} is not valid TOML: {exc}") from None
    else:
        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{path} is not valid YAML: {exc}") from None
    importers = [cls for cls in classes() if cls.config_kind is not None]
    for cls in importers:
        if cls.reads_config(path, cfg):
            return cls().import_config(cfg, flags)
    kinds = [str(cls.config_kind) for cls in importers]
    raise SpecError(f"{path} is neither {' nor '.join(kinds)}",
                    hint="for sd-scripts pass its dataset TOML and --flags \"...the training options...\"")
