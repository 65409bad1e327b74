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
    compute_capability: str
    gpu_class: str
    efficiency: float
    aliases: tuple[str, ...] = ()
    requires: dict[str, str] = field(default_factory=dict)

    @property
    def effective_tflops(self) -> float:
        """Paper peak times the class efficiency: what small-batch LoRA training sustains."""
        return self.bf16_tflops * self.efficiency


@cache
def load_gpus() -> tuple[Snapshot, tuple[GPU, ...]]:
    snap, raw = load_data("gpus")
    eff = raw["class_efficiency"]
    gpus = []
    for g in raw["gpus"]:
        gpus.append(
            GPU(
                name=g["name"],
                vram_gb=float(g["vram_gb"]),
                bf16_tflops=float(g["bf16_tflops"]),
                mem_bw_gbs=float(g["mem_bw_gbs"]),
                arch=g["arch"],
                compute_capability=str(g["compute_capability"]),
                gpu_class=g["class"],
                efficiency=float(eff[g["class"]]),
                aliases=tuple(str(a) for a in g.get("aliases", [])),
                requires={k: str(v) for k, v in (g.get("requires") or {}).items()},
            )
        )
    return snap, tuple(gpus)


def find_gpu(name: str) -> GPU:
    """Look a GPU up by name or alias ('4090', 'RTX_4090', 'nvidia a40'); PlanError if unknown."""
    _, gpus = load_gpus()
    key = normalise(name)
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
