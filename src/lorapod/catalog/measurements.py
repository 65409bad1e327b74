"""Published LoRA training measurements (data/measurements.yaml): what the planner is fitted to
and checked against.

Each point becomes one :class:`Observation` per measured metric: the model, the GPU and the
Settings it was taken at, the measured value, and the source it came from (for
leave-one-source-out cross-validation and ``lorapod plan --explain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.models import ImageModel, LLMArch, find_model, llm_from_config
from lorapod.catalog.snapshot import Snapshot, load_data
from lorapod.errors import PlanError
from lorapod.plan.vram import NOT_COUNTED_BY, Settings

# Metric names in the file -> (what is compared, kind of comparison).
# relative_seconds_per_step: a step time only comparable with the same source's other GPUs (the fit
# uses the ratios between GPUs for the same job, not the level).
SPEED_METRICS = {"seconds_per_step", "tokens_per_s", "max_seconds_per_step", "relative_seconds_per_step", "speed_ratio"}
VRAM_METRICS = {"peak_gb", "max_fit_gb", "fits_in_gb"}
BOUNDS = {"max_seconds_per_step", "fits_in_gb"}


@dataclass(frozen=True)
class Source:
    id: str
    url: str
    title: str
    read: str
    framework: str
    peak_reads: str = "device"  # how its peaks were read: device (nvidia-smi, or unsaid) | reserved | allocated


@dataclass(frozen=True)
class Observation:
    source: Source
    what: str
    model: ImageModel | LLMArch
    gpu_name: str
    settings: Settings
    metric: str  # seconds_per_step | peak_gb | ... (tokens_per_s is turned into seconds_per_step)
    value: float
    note: str = ""

    @property
    def is_speed(self) -> bool:
        return self.metric in SPEED_METRICS

    @property
    def is_bound(self) -> bool:
        return self.metric in BOUNDS

    def gpu(self) -> GPU:
        return gpu_by_name(self.gpu_name)


def _extra_gpus() -> dict[str, GPU]:
    _, raw = load_data("measurements")
    out = {}
    for g in raw.get("gpus", []):
        out[g["name"]] = GPU(g["name"], float(g["vram_gb"]), float(g["bf16_tflops"]), float(g["mem_bw_gbs"]),
                             g["arch"], "", g["class"])
    return out


def gpu_by_name(name: str) -> GPU:
    extra = _extra_gpus()
    return extra[name] if name in extra else find_gpu(name)


def _model(name: str, archs: dict[str, dict[str, Any]]) -> ImageModel | LLMArch:
    if name in archs:
        cfg = dict(archs[name])
        params = cfg.pop("params", None)
        arch = llm_from_config(cfg, name=name)
        if params:
            arch = LLMArch(**{**arch.__dict__, "params_override": float(params)})
        return arch
    return find_model(name)


def _settings(raw: dict[str, Any], framework: str, model: ImageModel | LLMArch) -> Settings:
    targets = raw.get("targets", "all-linear")
    res = raw.get("resolution", 1024)
    frames = raw.get("frames", 1)
    return Settings(
        base_dtype=raw.get("dtype", getattr(model, "default_dtype", "bf16")),
        r=int(raw.get("r", 16)),
        targets=targets if isinstance(targets, str) else tuple(targets),
        optimizer=raw.get("optimizer", "adamw"),
        gradient_checkpointing=bool(raw.get("gc", True)),
        batch=int(raw.get("batch", 1)),
        seq_len=int(raw.get("seq_len", 2048)),
        resolution=tuple(res) if isinstance(res, list) else int(res),
        cache_latents=bool(raw.get("cache_latents", True)),
        cache_text_encoder_outputs=bool(raw.get("cache_te", True)),
        train_text_encoder=bool(raw.get("train_te", False)),
        blocks_to_swap=int(raw.get("blocks_to_swap", 0)),
        frames=tuple(frames) if isinstance(frames, list) else int(frames),
        framework=framework,
        grad_accum=int(raw.get("grad_accum", 1)),
        text_tokens=int(raw.get("text_tokens", 0)),
        fp8_matmuls=bool(raw.get("fp8_matmuls", False)),
    )


@cache
def load_measurements() -> tuple[Snapshot, tuple[Observation, ...]]:
    """Every published observation, one per measured metric of each point."""
    snap, raw = load_data("measurements")
    sources = {s["id"]: s for s in raw["sources"]}
    archs = raw.get("archs", {})
    out: list[Observation] = []
    for i, p in enumerate(raw["points"]):
        src = sources.get(p["source"])
        if src is None:
            raise PlanError(f"measurements.yaml point {i}: unknown source {p['source']!r}")
        source = Source(src["id"], src["url"], src["title"], src["read"], src["framework"],
                        src.get("peak_reads", "device"))
        if source.peak_reads not in NOT_COUNTED_BY:
            raise PlanError(f"measurements.yaml source {source.id}: peak_reads {source.peak_reads!r} is not one of "
                            f"{', '.join(NOT_COUNTED_BY)}")
        merged = {**src.get("defaults", {}), **p.get("settings", {})}
        gpu_name = p.get("gpu") or merged.pop("gpu", "")
        merged.pop("gpu", None)
        fw = p.get("framework") or src["framework"]
        model = _model(p["model"], archs)
        s = _settings(merged, fw, model)
        what = f"{p['model']} {s.base_dtype}{' (fp8 matmuls)' if s.fp8_matmuls else ''} on {gpu_name}" + (
            f", {s.seq_len} tokens x {s.batch}" if isinstance(model, LLMArch) else f", {s.resolution} px x {s.batch}")
        for metric, value in p["measured"].items():
            if metric not in SPEED_METRICS | VRAM_METRICS:
                raise PlanError(f"measurements.yaml point {i}: unknown metric {metric!r}")
            if metric == "tokens_per_s":
                metric, value = "seconds_per_step", s.batch * s.seq_len / float(value)
            if metric == "peak_gb" and src.get("peak_unit", "GiB") == "GB":  # printed as bytes / 1e9
                value = float(value) * 1e9 / 2**30
            out.append(Observation(source, what, model, gpu_name, s, metric, float(value), str(p.get("note", ""))))
    return snap, tuple(out)
