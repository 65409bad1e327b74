"""Published LoRA training measurements (catalog/data/measurements.yaml): what the planner is
fitted to and checked against.

The figures are packaged data and stay in the catalog; this reader turns them into the planner's
own terms (its Settings, what each trainer's peak leaves out), so it lives in plan/, above the
catalog it reads, and the catalog imports nothing of the planner.

Each point becomes one :class:`Observation` per measured metric: the model, the GPU and the
Settings it was taken at, the measured value, and the source it came from (for
leave-one-source-out cross-validation and ``lorapod plan --explain``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
# Step figures as the sources print them, turned into seconds per micro-batch on load: an
# optimizer step is grad_accum micro-batches; it/s is the inverse of s/it (of the source's step).
PUBLISHED_SPEED = {"seconds_per_optimizer_step", "it_per_s"}
# What a speed source's ``unit`` says (the audit of 2026-12-01): what its "step" or "it" counts,
# how the figure is printed, whether it is per GPU or per node (every GPU of a data-parallel node
# runs the same steps), what the time includes, and the sentence it was read from.
UNIT_COUNTS = ("micro-batch", "optimizer")
UNIT_FIGURES = ("s/it", "it/s", "tokens/s", "wall")
UNIT_PER = ("gpu", "node")
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
    unit: Unit | None = None  # what its step figures count (every source with a step figure has one)


@dataclass(frozen=True)
class Unit:
    """What a source's step figure is: ``counts`` micro-batch or optimizer (step of grad_accum
    micro-batches), ``figure`` s/it | it/s | tokens/s | wall, ``per`` gpu | node, what the time
    includes (``wall``), and the sentence it was read from (``quote``)."""

    counts: str
    figure: str
    per: str
    wall: str
    quote: str


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
    printed: str = ""  # the figure as the source printed it, when the loader converted it


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
        out[g["name"]] = GPU(name=g["name"], vram_gb=float(g["vram_gb"]), bf16_tflops=float(g["bf16_tflops"]),
                             mem_bw_gbs=float(g["mem_bw_gbs"]), arch=g["arch"], gpu_class=g["class"])
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
                        src.get("peak_reads", "device"), _unit(src))
        if source.peak_reads not in NOT_COUNTED_BY:
            raise PlanError(f"measurements.yaml source {source.id}: peak_reads {source.peak_reads!r} is not one of "
                            f"{', '.join(NOT_COUNTED_BY)}")
        merged = {**src.get("defaults", {}), **p.get("settings", {})}
        gpu_name = p.get("gpu") or merged.pop("gpu", "")
        merged.pop("gpu", None)
        fw = p.get("framework") or src["framework"]
        model = _model(p["model"], archs)
        s = _settings(merged, fw, model)
        if p.get("url"):  # a source that gathers several texts: the point names its own
            source = replace(source, url=str(p["url"]))
        on = f" on {gpu_name}" if gpu_name else ""  # a card size ("fits in 24 GB") names no GPU
        what = f"{p['model']} {s.base_dtype}{' (fp8 matmuls)' if s.fp8_matmuls else ''}{on}" + (
            f", {s.seq_len} tokens x {s.batch}" if isinstance(model, LLMArch) else f", {s.resolution} px x {s.batch}")
        for metric, value in p["measured"].items():
            if metric not in SPEED_METRICS | VRAM_METRICS | PUBLISHED_SPEED:
                raise PlanError(f"measurements.yaml point {i}: unknown metric {metric!r}")
            printed = ""
            if metric in PUBLISHED_SPEED:
                printed = (f"{value:g} it/s" if metric == "it_per_s" else
                           f"{value:g} s per optimizer step of {s.grad_accum}")
            if metric in SPEED_METRICS | PUBLISHED_SPEED:
                metric, value = _per_micro_batch(i, source, metric, float(value), s.grad_accum)
            if metric == "tokens_per_s":
                metric, value = "seconds_per_step", s.batch * s.seq_len / float(value)
            if metric == "peak_gb" and src.get("peak_unit", "GiB") == "GB":  # printed as bytes / 1e9
                value = float(value) * 1e9 / 2**30
            out.append(Observation(source, what, model, gpu_name, s, metric, float(value), str(p.get("note", "")),
                                   printed))
    return snap, tuple(out)


def _unit(src: dict[str, Any]) -> Unit | None:
    raw = src.get("unit")
    if raw is None:
        return None
    u = Unit(str(raw.get("counts", "")), str(raw.get("figure", "")), str(raw.get("per", "")),
             str(raw.get("wall", "")), str(raw.get("quote", "")))
    for name, value, allowed in (("counts", u.counts, UNIT_COUNTS), ("figure", u.figure, UNIT_FIGURES),
                                 ("per", u.per, UNIT_PER)):
        if value not in allowed:
            raise PlanError(f"measurements.yaml source {src['id']}: unit.{name} {value!r} is not one of "
                            f"{', '.join(allowed)}")
    if not u.quote.strip() or not u.wall.strip():
        raise PlanError(f"measurements.yaml source {src['id']}: unit needs the sentence it was read from (quote) "
                        "and what the time includes (wall)")
    return u


def _per_micro_batch(i: int, source: Source, metric: str, value: float, grad_accum: int) -> tuple[str, float]:
    """A speed figure in the model's unit (seconds per micro-batch, or tokens/s per GPU), from the
    unit the source printed it in. Refuses a figure whose unit contradicts the source's audit: a
    step time of a source that counts optimizer steps with accumulation must be entered as
    ``seconds_per_optimizer_step`` (the reading that once put a FLUX run 4x off)."""
    unit = source.unit
    if unit is None:
        raise PlanError(f"measurements.yaml point {i}: source {source.id} gives a speed but no unit "
                        "(what its step counts and the sentence it was read from)")
    if metric in PUBLISHED_SPEED and unit.counts != "optimizer":
        raise PlanError(f"measurements.yaml point {i}: {metric} from {source.id}, whose steps are micro-batches")
    if metric == "it_per_s":
        return "seconds_per_step", 1.0 / value / grad_accum
    if metric == "seconds_per_optimizer_step":
        return "seconds_per_step", value / grad_accum
    if unit.counts == "optimizer" and grad_accum > 1 and metric in ("seconds_per_step", "max_seconds_per_step"):
        raise PlanError(f"measurements.yaml point {i}: {source.id} counts optimizer steps of {grad_accum} "
                        f"micro-batches: enter its figure as seconds_per_optimizer_step, not {metric}")
    return metric, value
