"""lorapod's built-in models: tiny random models built in code, named by ``lorapod:`` ids.

A spec that names one (``model.id: lorapod:tiny-llama``, what ``examples/demo.yaml`` trains)
runs anywhere with nothing downloaded, which is what the demos and the tests need. ``resolve``
is the one place such an id becomes a folder: the tokenizer loader (``lorapod.tokenizer``) and
the engine's model loader both call it, so they cannot disagree on what an id means.

Each id is one line in ``MODELS``: the name after ``lorapod:`` -> ``"module:function"``. The
function takes an empty folder and writes a complete model there in its library's own layout
(a transformers or diffusers folder that ``from_pretrained`` reads). It is imported only when its
id is first resolved, so naming a model here costs ``import lorapod`` nothing, and it must be
deterministic: the folder is built once under ``LORAPOD_HOME/models/<name>`` and reused by every
later run. A new built-in model is one builder in ``builtin/<kind>.py`` plus one line here.

The tiny diffusion models (``builtin/sd.py``, ``builtin/wan.py``) have no id yet: the demos and
the tests call their builders with a folder, because the diffusion engine's loader and the
planner take a folder or a hub id; giving them ids is one line here each once that loader calls
``resolve`` as the LLM loader does.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from lorapod.catalog.models import BUILTIN_PREFIX, is_builtin
from lorapod.errors import ModelLoadError
from lorapod.fsutil import writer_tag
from lorapod.home import lorapod_home

MODELS: dict[str, str] = {
    "tiny-llama": "lorapod.builtin.llm:build",  # the demo's small random Llama and its BPE tokenizer
    # the quality autopilot's scorers, random (builtin/scorers.py): plumbing for tests and demos
    "tiny-clip": "lorapod.builtin.scorers:build_clip",
    "tiny-siglip": "lorapod.builtin.scorers:build_siglip",
    "tiny-dinov2": "lorapod.builtin.scorers:build_dinov2",
}


def ids() -> list[str]:
    """Every built-in model id, prefix included (``lorapod:tiny-llama``)."""
    return [BUILTIN_PREFIX + name for name in sorted(MODELS)]


def resolve(model_id: str) -> str:
    """The folder holding the built-in model ``model_id``, built on first use.

    The model is built in a temporary folder beside its final place and renamed into it, so a
    folder that exists is complete, and two processes building it at once (the DDP ranks, two
    demos) both end with the same one.
    """
    name = model_id[len(BUILTIN_PREFIX):] if is_builtin(model_id) else None
    if name not in MODELS:
        raise ModelLoadError(f"'{model_id}' is not one of lorapod's built-in models",
                             hint=f"the built-ins are {', '.join(ids())}; anything else is a hub id, a catalog "
                             "alias or a model folder")
    folder = lorapod_home() / "models" / name
    if _built(folder):
        return str(folder)
    module, _, function = MODELS[name].partition(":")
    build = getattr(importlib.import_module(module), function)
    tmp = folder.with_name(f".tmp-{name}-{writer_tag()}")  # a sweep builds from threads
    try:
        build(tmp)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, folder)
        except OSError as exc:
            if not _built(folder):  # else another process built it first: theirs is as good as ours
                raise ModelLoadError(f"cannot put the built-in model {model_id} in {folder}: {exc}",
                                     hint="check that LORAPOD_HOME is writable and has room") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)


def _built(folder) -> bool:
    """A folder that exists holds a finished build (it appears only by the rename)."""
    return folder.is_dir() and any(folder.iterdir())


def build_once(folder: Path, recipe: dict, build: Callable[[Path], object], log: Callable[[str], object],
               what: str) -> Path:
    """``folder`` holding a model that ``build`` writes, reused while the stamp beside it says it was
    built from this ``recipe`` (the demos' toy bases: a new recipe writes the folder again). ``what``
    is the line said before building."""
    stamp = folder / "lorapod-build.json"
    if (folder / "model_index.json").is_file() and stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        log(f"base model: {folder} (written before, reused)")
        return folder
    log(what)
    shutil.rmtree(folder, ignore_errors=True)
    build(folder)
    stamp.write_text(json.dumps(recipe), encoding="utf-8")
    return folder
