"""Learning from the user's own runs: a measured step beats any model.

The ledger knows every job lorapod ran on a rented GPU (its run folder and the instance's GPU);
the run folder has the resolved spec and ``metrics.jsonl`` with each optimizer step's time and
peak memory. When the planner is asked about a job, finished jobs not yet read are measured
once (median seconds per micro-batch, highest memory) and kept in the ledger's
``measured_runs`` table, so a run folder deleted later is still remembered.

A past run *matches* a job when the model and every setting that changes the work are the same
(precision, rank, targets, optimizer, checkpointing, batch, sequence length or resolution,
frames, caching, block swap). On the same GPU its median time is the estimate; on another GPU
the model's ratio between the two GPUs carries it over. Either way the plan says so, and
``lorapod plan --explain`` lists the runs.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.models import ImageModel, LLMArch, find_model
from lorapod.errors import LorapodError
from lorapod.plan.vram import Settings

# Steps skipped at the start of a run (compilation, allocator warm-up, first caching).
WARMUP_STEPS = 3
# Range printed around a measured figure: the spread of the matching runs, at least this much.
MEASURED_SPREAD = 0.10
FINISHED = ("done", "stopped", "failed", "interrupted")
KEYS = ("base_dtype", "r", "targets", "optimizer", "gradient_checkpointing", "batch", "seq_len", "resolution",
        "cache_latents", "cache_text_encoder_outputs", "train_text_encoder", "blocks_to_swap", "frames")


@dataclass(frozen=True)
class Match:
    """One of the user's runs an estimate rests on."""

    job_id: str
    gpu: str
    seconds_per_step: float
    peak_gb: float | None
    same_gpu: bool


def settings_key(s: Settings | dict[str, Any]) -> tuple[str, ...]:
    d = asdict(s) if isinstance(s, Settings) else s
    return tuple(json.dumps(d.get(k), sort_keys=True) for k in KEYS)


def read_run(run_dir: str | Path) -> tuple[str, Settings, float | None, float | None, int] | None:
    """(model name, settings, median seconds per micro-batch, peak GB, steps) of a run folder."""
    from lorapod.spec import load_spec

    root = Path(run_dir)
    spec_path, metrics_path = root / "spec.yaml", root / "metrics.jsonl"
    if not (spec_path.is_file() and metrics_path.is_file()):
        return None
    try:
        spec = load_spec(spec_path)
        model = find_model(spec.model.id, spec.model.family, spec.model.variant)
    except LorapodError:
        return None
    times, peaks = [], []
    for line in metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step_time_s" in rec and rec.get("step", 0) > WARMUP_STEPS:
            times.append(float(rec["step_time_s"]) / max(1, spec.train.grad_accum))
        if "mem_gb" in rec:
            peaks.append(float(rec["mem_gb"]))
    if not times and not peaks:
        return None
    seconds = statistics.median(times) if times else None
    return model.name, Settings.from_spec(spec, model), seconds, (max(peaks) if peaks else None), len(times)


def sync(ledger: Any) -> None:
    """Measure finished jobs the ledger has not measured yet."""
    known = {m["job_id"] for m in ledger.measurements()}
    for job in ledger.jobs():
        if job.id in known or job.state not in FINISHED:
            continue
        gpus = [i.gpu_name for i in ledger.job_instances(job.id) if i.gpu_name]
        got = read_run(job.run_dir)
        if got is None or not gpus:
            continue
        name, s, seconds, peak, steps = got
        ledger.record_measurement(job.id, _gpu_name(gpus[-1]), name, asdict(s), seconds, peak, steps)


def _gpu_name(raw: str) -> str:
    try:
        return find_gpu(raw).name
    except LorapodError:
        return raw


def _ledger():
    from lorapod.compute.ledger import Ledger, lorapod_home

    path = lorapod_home() / "ledger.db"
    return Ledger(path) if path.is_file() else None


def matching_runs(model: ImageModel | LLMArch, s: Settings) -> list[dict[str, Any]]:
    """The user's measured runs of this model with these settings (any GPU)."""
    ledger = _ledger()
    if ledger is None:
        return []
    try:
        sync(ledger)
        key = settings_key(s)
        return [m for m in ledger.measurements()
                if m["model"] == model.name and m["seconds_per_step"] and settings_key(m["settings"]) == key]
    finally:
        ledger.close()


def measured_speed(model: ImageModel | LLMArch, s: Settings, gpu: GPU, speed: Any) -> Any:
    """The model's Speed replaced by the user's runs when some match, else None."""
    from lorapod.plan.fit import fitted
    from lorapod.plan.speed import Speed, predict

    runs = matching_runs(model, s)
    if not runs:
        return None
    same = [r for r in runs if r["gpu_name"] == gpu.name]
    use = same or runs
    values = []
    for r in use:
        if r["gpu_name"] == gpu.name:
            values.append(r["seconds_per_step"])
            continue
        try:
            theirs = find_gpu(r["gpu_name"])
        except LorapodError:
            continue
        params = fitted()
        ratio = predict(model, s, gpu, params)[0] / predict(model, s, theirs, params)[0]
        values.append(r["seconds_per_step"] * ratio)
    if not values:
        return None
    seconds = statistics.median(values)
    spread = max(MEASURED_SPREAD, (max(values) - min(values)) / 2 / seconds) if len(values) > 1 else MEASURED_SPREAD
    if not same:  # carried over from another GPU: the model's GPU ratio adds its own error
        spread = max(spread, (speed.high - speed.low) / 2 / speed.seconds_per_step)
    matches = tuple(Match(r["job_id"], r["gpu_name"], r["seconds_per_step"], r["peak_gb"], r["gpu_name"] == gpu.name)
                    for r in use)
    return Speed(seconds, speed.tokens_per_step, False, speed.efficiency, seconds * (1 - spread),
                 seconds * (1 + spread), "your runs", speed.terms, matches)
