"""Start-up stand-ins for running the trainers on a CPU torch, in the trainer's own processes.

Installed into a trainer's CPU virtualenv by tools/upstream/real_run.py (``--setup-shims``) as
``lorapod_cpu_shims.py`` plus a ``.pth`` line that imports it, so they apply in every process the
trainer starts (``accelerate launch`` starts its own Python). They act only when
``LORAPOD_CPU_SHIMS`` names them (real_run.py sets it), so the virtualenv is otherwise untouched.
The same three stand-ins as tools/upstream/probes.py, each for a reason the trainer's code gives:

- ``torchvision``: the PyPI torchvision wheel is built against CUDA torch; its
  ``_meta_registrations`` (fake ops for ``torchvision::nms`` ...) fail on CPU torch at import.
  The trainers use torchvision's transforms only, which need none: the module is left empty.
- ``cuda_device``: musubi-tuner's wan/modules/t5.py calls ``torch.cuda.current_device()`` at
  import time (a default argument); on CPU torch it raises. It answers 0; nothing then runs on it
  (the run's device is the CPU).
- ``torchaudio``: ai-toolkit's toolkit/config_modules.py imports it at the top; there is no
  torchaudio wheel for CPU torch 2.13, and no image-LoRA path calls it. An empty module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

_ON = set(filter(None, os.environ.get("LORAPOD_CPU_SHIMS", "").split(",")))


def _empty(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    """Patches ``torch.cuda.current_device`` once ``torch.cuda`` has been imported (torch stays lazy)."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.current_device = lambda: 0

        spec.loader.exec_module = exec_module
        return spec


if "torchvision" in _ON:
    sys.modules.setdefault("torchvision._meta_registrations", _empty("torchvision._meta_registrations"))
if "torchaudio" in _ON:
    sys.modules.setdefault("torchaudio", _empty("torchaudio"))
if "cuda_device" in _ON:
    sys.meta_path.insert(0, _AfterTorchCuda())
