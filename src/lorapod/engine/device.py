"""Device and precision choices, made once so every recipe agrees.

``auto`` precision means bf16 on GPUs that support it, fp16 (with loss scaling) on older GPUs,
and fp32 on CPU, where autocast buys little and costs accuracy in tests.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from lorapod.errors import HardwareError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    device: torch.device
    compute: str  # bf16 | fp16 | fp32 : autocast dtype
    weights: torch.dtype  # dtype of the frozen base weights

    @property
    def autocast_dtype(self) -> torch.dtype:
        return _DTYPES[self.compute]

    def autocast(self):
        if self.compute == "fp32":
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @property
    def needs_grad_scaler(self) -> bool:
        return self.compute == "fp16" and self.device.type == "cuda"


#: The caching allocator's setting lorapod runs CUDA jobs with, unless the user set one. Bucketed
#: image sizes, Wan windows and packed rows change tensor shapes from step to step, and block swap
#: adds a side stream with its own pool: with fixed-size segments the allocator can hold memory it
#: cannot reuse ("reserved but unallocated", which torch's own OOM text tells to fix this way).
#: Expandable segments grow one mapping instead (torch >= 2.1; review N9).
ALLOC_CONF = "expandable_segments:True"
#: torch >= 2.9 reads PYTORCH_ALLOC_CONF first and PYTORCH_CUDA_ALLOC_CONF "for backward
#: compatibility, with lower priority" (``c10/core/AllocatorConfig.h@2.13.0:158-160``); 2.7 and 2.8
#: read only the second, which lorapod sets.
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def default_alloc_conf(env: dict[str, str] | None = None) -> str | None:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to :data:`ALLOC_CONF` unless either variable is set already.
    Must run before the first CUDA allocation (the allocator reads it once). Returns what it set."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    if any(env.get(v) for v in ALLOC_CONF_VARS):
        return None
    env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF
    return ALLOC_CONF


def pick_device(requested: str | None = None) -> torch.device:
    default_alloc_conf()  # before anything touches CUDA's allocator
    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            # never a silent fall back to the CPU (review N4): a remote job is started with --device cuda
            raise HardwareError(f"--device {requested}: torch {torch.__version__} cannot use a GPU here "
                                f"(torch.cuda.is_available() is False; built for CUDA {torch.version.cuda or 'none'})",
                                hint="install a torch built for a CUDA this machine's driver runs, or use --device cpu")
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def bf16_native(device: torch.device) -> bool:
    """Whether the GPU computes bf16 in hardware (Ampere, compute capability 8.0, and later).

    ``torch.cuda.is_bf16_supported()`` also answers True where bf16 is only emulated (T4, V100):
    many times slower than fp16 there, and cuDNN has no bf16 convolutions below 8.0, so an image
    model's UNet/VAE under bf16 autocast fails. ``auto`` must pick fp16 + loss scaling on those."""
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def resolve_precision(precision: str, weights_dtype: str, device: torch.device) -> Precision:
    cuda = device.type == "cuda"
    bf16_ok = cuda and bf16_native(device)
    if precision == "auto":
        compute = ("bf16" if bf16_ok else "fp16") if cuda else "fp32"
    else:
        compute = precision
    if compute == "bf16" and cuda and not bf16_ok:
        raise HardwareError("this GPU does not support bf16", hint="set train.precision: fp16")
    if compute == "fp16" and not cuda:
        raise HardwareError("fp16 training needs a CUDA GPU", hint="use train.precision: fp32 (or bf16) on CPU")
    if weights_dtype == "fp8":
        if not cuda or torch.cuda.get_device_capability(device) < (8, 9):
            raise HardwareError(
                "fp8 base weights need an Ada or Hopper GPU (RTX 4090, L40S, H100...)",
                hint="set model.dtype: bf16 (or auto) on this machine",
            )
        weights = torch.float8_e4m3fn
    elif weights_dtype == "auto":
        weights = _DTYPES[compute] if cuda else torch.float32
    else:
        weights = _DTYPES[weights_dtype]
    if cuda:
        use_tf32()
    return Precision(device=device, compute=compute, weights=weights)


GiB = 1024**3


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak accelerator memory on CUDA since :func:`reset_peak_memory` (training start), in GiB like
    the plan: ``mem_gb`` is what tensors held (``max_memory_allocated``, the planner's
    ``read_as("allocated")``), ``mem_reserved_gb`` what the caching allocator held. On CPU the
    resident set size of the process (GiB too)."""
    if device.type == "cuda":
        return {"mem_gb": round(torch.cuda.max_memory_allocated(device) / GiB, 3),
                "mem_reserved_gb": round(torch.cuda.max_memory_reserved(device) / GiB, 3)}
    try:
        import psutil

        return {"rss_gb": round(psutil.Process().memory_info().rss / GiB, 3)}
    except ImportError:
        return {}


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak over: what training holds, not what loading the model or caching latents did."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    """The allocated peak (GiB) since the last reset; None off CUDA."""
    return torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None


def peak_reserved_gb(device: torch.device) -> float | None:
    """What the caching allocator held at most (GiB) since the last reset; None off CUDA. Above the
    allocated peak by memory reserved but not handed to any tensor (fragmentation)."""
    return torch.cuda.max_memory_reserved(device) / GiB if device.type == "cuda" else None


def device_memory_gb(device: torch.device) -> float | None:
    """What the GPU holds in all (GiB); None off CUDA."""
    return torch.cuda.get_device_properties(device).total_memory / GiB if device.type == "cuda" else None


def use_tf32() -> None:
    """fp32 matmuls and convolutions on TF32 tensor cores (Ampere and later): ``precision: fp32``,
    the fp32 VAE in fp16 mode, anything outside autocast. PyTorch leaves matmuls in full FP32 by
    default, several times slower; TF32 keeps fp32's range with a 10-bit mantissa, what every
    trainer (sd-scripts, musubi-tuner, the HF Trainer's ``tf32``) turns on for training.

    Two APIs, one per torch generation (review N1): torch >= 2.9 has ``fp32_precision`` and
    refuses a read of the legacy flags once it is set ("mix of the legacy and new APIs"); torch
    2.7 and 2.8 (RunPod's default image) have only ``allow_tf32``, and their ``cuBLASModule``
    raises ``AttributeError('Unknown attribute fp32_precision')`` on the new name
    (``torch/backends/cuda/__init__.py@2.8.0:140-149``). The API is chosen by what the module has."""
    set_tf32(True)


def new_tf32_api() -> bool:
    """Whether this torch has the ``fp32_precision`` API (2.9 and later). ``hasattr`` is safe on
    both: the 2.8 module's ``__getattr__`` raises AttributeError for a name it does not know."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def tf32_flags() -> tuple[bool, bool]:
    """(matmuls, convolutions) on TF32, read through the API this torch has."""
    if new_tf32_api():
        return (torch.backends.cuda.matmul.fp32_precision == "tf32",
                torch.backends.cudnn.conv.fp32_precision == "tf32")
    return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def set_tf32(matmul: bool, conv: bool | None = None) -> None:
    """Turn TF32 on or off for matmuls (and convolutions: ``conv``, default the same)."""
    conv = matmul if conv is None else conv
    if new_tf32_api():
        torch.backends.cuda.matmul.fp32_precision = "tf32" if matmul else "ieee"
        torch.backends.cudnn.conv.fp32_precision = "tf32" if conv else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv


def device_name(device: torch.device) -> str | None:
    """What the driver calls the accelerator ('NVIDIA GeForce RTX 4090'); None on CPU.

    The one place that asks torch for it: the planner learns a run's speed for this GPU
    (``device.json`` in the run folder, read by :mod:`lorapod.plan.learned`)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


def describe_device(device: torch.device, processes: int = 1, from_step: int = 0) -> dict[str, object]:
    """What a run folder's ``device.json`` holds: where the steps in metrics.jsonl after
    ``from_step`` (where this process started or resumed) were timed."""
    return {"type": device.type, "name": device_name(device), "processes": processes, "from_step": from_step}
