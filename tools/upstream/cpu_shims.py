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
- ``umt5_random``: musubi-tuner's umT5-XXL text encoder has 5.7 B parameters (11 GB in bf16),
  more than this machine runs beside a training job. ``T5EncoderModel`` (wan/modules/t5.py) is
  answered by a stand-in that returns what the real one returns, a ``[tokens, 4096]`` bf16 tensor
  per caption (``u[:v]`` of its ``__call__``), random, seeded by the caption; musubi's own
  wan_cache_text_encoder_outputs.py runs around it and writes its cache files.
- ``torchaudio``: ai-toolkit's toolkit/config_modules.py imports it at the top; there is no
  torchaudio wheel for CPU torch 2.13, and no image-LoRA path calls it. An empty module.
- ``bf16_cpu``: a CPU without bf16 instructions (AVX2, as this project's CI machines) runs torch's
  bf16 convolutions and matrix products emulated: a Conv3d 77x and a Conv2d 150x slower than in
  fp32, a Linear 7x (measured on torch 2.13). musubi-tuner runs its VAEs and text encoders in bf16
  whatever the precision (``wan_cache_latents.py``: ``vae_dtype = torch.bfloat16``), so Wan's latent
  cache alone took over 5 minutes for two clips. ``F.linear``, ``F.conv2d`` and ``F.conv3d`` on a
  CPU, where bf16 is asked (bf16 operands, or a bf16 autocast on the CPU), round their inputs to bf16
  as the op would, compute in fp32 and return bf16: what a GPU's bf16 kernels do (fp32
  accumulation). Other calls are untouched.
- ``depth``: Z-Image's and Qwen-Image's models are too large for a 24 GB CPU machine
  (real_models.py says by how much), so they are built shallower, never narrower: :data:`DEPTH`
  layers, set where musubi-tuner builds each one (its Z-Image DiT's layer count constant, the Qwen3 /
  Qwen2.5-VL configs its loaders make, the Qwen-Image DiT's ``create_model``). real_models.py builds the
  random-weight files under the same shim, so files and models agree.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import types

_ON = set(filter(None, os.environ.get("LORAPOD_CPU_SHIMS", "").split(",")))
# the layers the ``depth`` shim keeps (real models: 30, 36, 60, 28 and 32)
DEPTH = {"zimage_dit_layers": 1, "qwen3_layers": 2, "qwenimage_dit_layers": 1, "qwen25vl_layers": 2,
         "qwen25vl_vision_depth": 1}


def _empty(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` once ``name`` has been imported (nothing is imported early)."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _cuda_device(module) -> None:
    module.current_device = lambda: 0


def _umt5_random(module) -> None:
    import torch

    class RandomUmT5:
        """The stand-in for ``T5EncoderModel`` (see the module docstring)."""

        def __init__(self, text_len, dtype=torch.bfloat16, device="cpu", **kwargs) -> None:
            self.text_len, self.dtype = text_len, dtype

        def __call__(self, texts, device):
            out = []
            for text in texts:
                g = torch.Generator().manual_seed(sum(text.encode()) % (2 ** 31))
                n = min(len(text.split()) + 1, self.text_len)  # the words + </s>
                out.append(torch.randn(n, 4096, generator=g).to(self.dtype))
            return out

    module.T5EncoderModel = RandomUmT5


if "torchvision" in _ON:
    sys.modules.setdefault("torchvision._meta_registrations", _empty("torchvision._meta_registrations"))
if "torchaudio" in _ON:
    sys.modules.setdefault("torchaudio", _empty("torchaudio"))
if "cuda_device" in _ON:
    sys.meta_path.insert(0, _AfterImport("torch.cuda", _cuda_device))
if "umt5_random" in _ON:
    sys.meta_path.insert(0, _AfterImport("musubi_tuner.wan.modules.t5", _umt5_random))


def _bf16_cpu() -> None:
    import torch
    import torch.nn.functional as F

    def in_fp32(op):
        @functools.wraps(op)
        def run(input, weight, bias=None, *args, **kwargs):
            if input.device.type != "cpu":
                return op(input, weight, bias, *args, **kwargs)
            auto = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            plain = input.dtype == weight.dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16)
            if not (auto or plain):  # fp32, or mixed dtypes the op refuses itself
                return op(input, weight, bias, *args, **kwargs)

            def up(t):
                return None if t is None else t.to(torch.bfloat16).float()

            with torch.autocast("cpu", enabled=False):
                return op(up(input), up(weight), up(bias), *args, **kwargs).to(torch.bfloat16)
        return run

    F.linear, F.conv2d, F.conv3d = in_fp32(F.linear), in_fp32(F.conv2d), in_fp32(F.conv3d)


if "bf16_cpu" in _ON:
    _bf16_cpu()


def _zimage_config(module) -> None:
    module.DEFAULT_TRANSFORMER_N_LAYERS = DEPTH["zimage_dit_layers"]


def _shallow_config(cls_name: str, reduce):
    """Patch ``module.<cls_name>`` (a transformers config class a musubi loader calls with its JSON)."""
    def patch(module) -> None:
        real = getattr(module, cls_name)

        @functools.wraps(real)
        def build(*args, **kwargs):
            return real(*args, **reduce(dict(kwargs)))

        setattr(module, cls_name, build)
    return patch


def _qwen3(kwargs: dict) -> dict:
    return {**kwargs, "num_hidden_layers": DEPTH["qwen3_layers"], "max_window_layers": DEPTH["qwen3_layers"]}


def _qwen25vl(kwargs: dict) -> dict:
    n = DEPTH["qwen25vl_layers"]
    out = {**kwargs, "num_hidden_layers": n, "max_window_layers": n}
    if isinstance(out.get("text_config"), dict):
        text = {**out["text_config"], "num_hidden_layers": n, "max_window_layers": n}
        if isinstance(text.get("layer_types"), list):  # one per layer (transformers validates the count)
            text["layer_types"] = text["layer_types"][:n]
        out["text_config"] = text
    out["vision_config"] = {**(out.get("vision_config") or {}), "depth": DEPTH["qwen25vl_vision_depth"]}
    return out


def _qwenimage_model(module) -> None:
    real = module.create_model

    @functools.wraps(real)
    def create_model(*args, **kwargs):
        kwargs["num_layers"] = DEPTH["qwenimage_dit_layers"]
        return real(*args, **kwargs)

    module.create_model = create_model


if "depth" in _ON:
    sys.meta_path.insert(0, _AfterImport("musubi_tuner.zimage.zimage_config", _zimage_config))
    sys.meta_path.insert(0, _AfterImport("musubi_tuner.zimage.zimage_utils", _shallow_config("Qwen3Config", _qwen3)))
    sys.meta_path.insert(0, _AfterImport("musubi_tuner.qwen_image.qwen_image_utils",
                                         _shallow_config("Qwen2_5_VLConfig", _qwen25vl)))
    sys.meta_path.insert(0, _AfterImport("musubi_tuner.qwen_image.qwen_image_model", _qwenimage_model))
