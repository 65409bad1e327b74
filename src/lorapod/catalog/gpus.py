"""The GPU catalog: memory, bf16 throughput, bandwidth and what each card needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from lorapod.catalog.snapshot import Snapshot, closest_canonical, load_data, normalise
from lorapod.errors import PlanError


@dataclass(frozen=True)
class GPU:
    name: str
    vram_gb: float
    bf16_tflops: float
    mem_bw_gbs: float
    arch: str
    gpu_class: str
    aliases: tuple[str, ...] = ()
    requires: dict[str, str] = field(default_factory=dict)
    device_names: tuple[str, ...] = ()  # what the driver calls it: torch.cuda.get_device_name()


@cache
def load_gpus() -> tuple[Snapshot, tuple[GPU, ...]]:
    snap, raw = load_data("gpus")
    gpus = []
    for g in raw["gpus"]:
        gpus.append(
            GPU(
                name=g["name"],
                vram_gb=float(g["vram_gb"]),
                bf16_tflops=float(g["bf16_tflops"]),
                mem_bw_gbs=float(g["mem_bw_gbs"]),
                arch=g["arch"],
                gpu_class=g["class"],
                aliases=tuple(str(a) for a in g.get("aliases", [])),
                requires={k: str(v) for k, v in (g.get("requires") or {}).items()},
                device_names=tuple(str(d) for d in g.get("device_names", [])),
            )
        )
    return snap, tuple(gpus)


@cache
def shared_names() -> dict[str, tuple[str, ...]]:
    """Names several cards go by ('A100 PCIe': the 40 GB and the 80 GB card), normalised -> the
    catalog names they may stand for (gpus.yaml ``shared_names``)."""
    _, raw = load_data("gpus")
    return {normalise(k): tuple(v) for k, v in (raw.get("shared_names") or {}).items()}


def find_gpu(name: str, vram_gb: float | None = None) -> GPU:
    """Look a GPU up by name or alias ('4090', 'RTX_4090', 'nvidia a40'); PlanError if unknown.

    A name several cards share ('A100 PCIe') is read by ``vram_gb`` (what a provider's offer lists,
    within 15%), and refused without it, naming the cards it could be: never one of them silently."""
    _, gpus = load_gpus()
    key = normalise(name)
    shared = shared_names().get(key) or shared_names().get(normalise(key.removeprefix("nvidia ")))
    if shared:
        cards = [g for g in gpus if g.name in shared]
        fits = [g for g in cards if vram_gb and abs(g.vram_gb - vram_gb) <= 0.15 * g.vram_gb]
        if len(fits) == 1:
            return fits[0]
        raise PlanError(f"GPU {name!r} is made with {' and '.join(f'{g.vram_gb:g} GB' for g in cards)}: say which",
                        hint="one of " + ", ".join(repr(g.name) for g in cards))
    for g in gpus:
        if key == normalise(g.name) or key in (normalise(a) for a in g.aliases):
            return g
    # Vast.ai / RunPod spell names their own way ("NVIDIA GeForce RTX 4090", "H100 80GB HBM3").
    for g in gpus:
        if normalise(g.name) in key and not any(
            normalise(o.name) in key and len(o.name) > len(g.name) for o in gpus
        ):
            return g
    known = [g.name for g in gpus]
    near = closest_canonical(name, {a: g.name for g in gpus for a in (g.name, *g.aliases)})
    hint = f"did you mean {', '.join(repr(n) for n in near)}?" if near else f"known GPUs: {', '.join(known)}"
    raise PlanError(f"unknown GPU {name!r}", hint=hint)


def gpu_from_device_name(device_name: str) -> GPU | None:
    """The catalog GPU the driver's name stands for ('NVIDIA H100 80GB HBM3' -> H100 SXM), else None.

    Exact, unlike :func:`find_gpu`'s reading of a provider's spelling: a measured step on an
    'RTX 4090 D' or an 'H100 NVL' must not teach the planner about an RTX 4090 or an H100 SXM.
    """
    key = normalise(device_name)
    _, gpus = load_gpus()
    return next((g for g in gpus if key in (normalise(d) for d in g.device_names)), None)
