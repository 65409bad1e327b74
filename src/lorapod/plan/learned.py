"""Learning from the user's own runs: a measured step beats any model.

A finished run is measured once (median seconds per micro-batch after warm-up, highest memory)
and kept in the ledger's ``measured_runs`` table, so a run folder deleted later is still
remembered. One path, :func:`record_run`, does it for every kind of run:

* a local ``lorapod train`` records itself when it ends (:func:`record_local`);
* a ``lorapod run`` job is recorded by its controller when the job ends (:func:`record_job`),
  and any finished job not yet measured (an older lorapod, a controller that died) is measured
  when the planner is next asked (:func:`sync`).

The GPU is the one the engine saw (``device.json`` in the run folder, the driver's name mapped
exactly onto the catalog by :func:`lorapod.catalog.gpus.gpu_from_device_name`), else the rented
instance's. A CPU run, a GPU the catalog does not know, or a data-parallel run teaches nothing
about one catalog GPU and is not recorded (the reason goes to the debug log and events.log).

A past run *matches* a job when the model and every setting that changes the work are the same
(precision, rank, targets, optimizer, checkpointing, batch, sequence length or resolution,
frames, caching, block swap). On the same GPU its median time is the estimate; on another GPU
the model's ratio between the two GPUs carries it over. Either way the plan says so, and
``lorapod plan --explain`` lists the runs.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.catalog.gpus import GPU, find_gpu, gpu_from_device_name
from lorapod.catalog.models import ImageModel, LLMArch, find_model
from lorapod.errors import LorapodError
from lorapod.plan.speed import Params, predict
from lorapod.plan.vram import Settings
from lorapod.rundir.layout import METRICS
from lorapod.rundir.metrics import number, read_records

if TYPE_CHECKING:
    from lorapod.store.ledger import Ledger

# Steps skipped at the start of a run (compilation, allocator warm-up, first caching).
WARMUP_STEPS = 3
# Range printed around a measured figure: the spread of the matching runs, at least this much.
MEASURED_SPREAD = 0.10
FINISHED = ("done", "stopped", "failed", "interrupted")
# Set by the remote job script (compute/remote.py JOB_SH): the controller records that run.
IN_REMOTE_JOB = "LORAPOD_REMOTE_JOB"
log = logging.getLogger(__name__)
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
    spec_path, metrics_path = root / "spec.yaml", root / METRICS
    if not (spec_path.is_file() and metrics_path.is_file()):
        return None
    try:
        spec = load_spec(spec_path)
        model = find_model(spec.model.id, spec.model.family, spec.model.variant)
    except LorapodError:
        return None
    first = number(_device_info(root).get("from_step")) or 0  # a resumed run: only the steps timed on this device
    times, peaks = [], []
    for rec in read_records(metrics_path):  # the one reader (rundir/metrics.py): a step is an integer
        if rec["step"] <= first:
            continue
        if (t := number(rec.get("step_time_s"))) is not None and t > 0 and rec["step"] > first + WARMUP_STEPS:
            times.append(t / max(1, spec.train.grad_accum))
        if (gb := number(rec.get("mem_gb"))) is not None and gb >= 0:
            peaks.append(gb)
    if not times and not peaks:
        return None
    seconds = statistics.median(times) if times else None
    return model.name, Settings.from_spec(spec, model), seconds, (max(peaks) if peaks else None), len(times)


@dataclass(frozen=True)
class Measured:
    """What one finished run measured, as the ledger keeps it."""

    model: str
    settings: Settings
    gpu: str
    seconds_per_step: float | None
    peak_gb: float | None
    steps: int


def measure_run(run_dir: str | Path, instance_gpu: str | None = None) -> tuple[Measured | None, str]:
    """The run's measurement, or None and why it teaches the planner nothing."""
    gpu, why = _run_gpu(Path(run_dir), instance_gpu)
    if gpu is None:
        return None, why
    got = read_run(run_dir)
    if got is None:
        return None, "no readable spec.yaml and metrics.jsonl with step times, or a model the catalog does not know"
    name, s, seconds, peak, steps = got
    return Measured(name, s, gpu, seconds, peak, steps), f"{name} on {gpu}"


def _run_gpu(root: Path, instance_gpu: str | None) -> tuple[str | None, str]:
    """The catalog name of the GPU the run's steps were timed on: the engine's word, else the instance's."""
    info = _device_info(root)
    if info:
        name = info.get("name")
        if not name:
            return None, f"trained on {info.get('type') or 'an unknown device'}, not a GPU"
        if int(info.get("processes") or 1) > 1:
            return None, f"data-parallel over {info['processes']} processes: not one GPU's step time"
        gpu = gpu_from_device_name(str(name))
        if gpu is None:
            return None, f"GPU {name!r} is not in the catalog (catalog/data/gpus.yaml device_names)"
        return gpu.name, ""
    if not instance_gpu:
        return None, "no device.json in the run folder and no GPU in the ledger"
    try:
        return find_gpu(instance_gpu).name, ""
    except LorapodError:
        return None, f"GPU {instance_gpu!r} is not in the catalog"


def _device_info(root: Path) -> dict[str, Any]:
    """The run folder's ``device.json`` (written by the engine), {} when absent or unreadable."""
    try:
        info = json.loads((root / "device.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def record_run(ledger: Any, job_id: str, run_dir: str | Path, instance_gpu: str | None = None) -> Measured | None:
    """Measure one finished run into the ledger (again under the same id: replaced, never doubled)."""
    return _store(ledger, job_id, *measure_run(run_dir, instance_gpu))


def _store(ledger: Any, job_id: str, m: Measured | None, why: str) -> Measured | None:
    if m is None:
        log.debug("run %s not recorded for the planner: %s", job_id, why)
        return None
    ledger.record_measurement(job_id, m.gpu, m.model, asdict(m.settings), m.seconds_per_step, m.peak_gb, m.steps)
    log.debug("run %s recorded for the planner: %s", job_id, why)
    return m


def record_job(ledger: Any, job_id: str) -> Measured | None:
    """A ``lorapod run`` job, when it ends: its pulled run folder and its instance's GPU."""
    job = ledger.job(job_id)
    if job is None or job.state not in FINISHED:
        return None
    gpus = [i.gpu_name for i in ledger.job_instances(job.id) if i.gpu_name]
    return record_run(ledger, job.id, job.run_dir, gpus[-1] if gpus else None)


def record_local(run_dir: str | Path) -> tuple[Measured | None, str]:
    """A local ``lorapod train`` that ended, into this machine's ledger (``$LORAPOD_HOME/ledger.db``,
    made if need be); returns the measurement (None when not recorded) and what was or why not."""
    from lorapod.store.ledger import Ledger

    root = Path(run_dir)
    if os.environ.get(IN_REMOTE_JOB):
        m, why = None, "part of a `lorapod run` job: its controller records it"
    else:
        m, why = measure_run(root)
    if m is None:
        return _store(None, root.name, None, why), why
    ledger = Ledger()
    try:
        return _store(ledger, root.name, m, why), why
    finally:
        ledger.close()


def sync(ledger: Any) -> None:
    """Measure finished jobs the ledger has not measured yet (recorded at job end since; older ones here)."""
    known = {m["job_id"] for m in ledger.measurements()}
    for job in ledger.jobs():
        if job.id not in known and job.state in FINISHED:
            record_job(ledger, job.id)


def _ledger() -> Ledger | None:
    from lorapod.home import lorapod_home
    from lorapod.store.ledger import Ledger

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


def measured_step(model: ImageModel | LLMArch, s: Settings, gpu: GPU, params: Params,
                  model_half_width: float) -> tuple[float, float, tuple[Match, ...]] | None:
    """(seconds per micro-batch, relative half-width of its range, the runs it rests on) from the
    user's runs that match, else None. A run on another GPU is carried over by the speed model's
    ratio between the two GPUs (``params``: the fitted parameters), so its range is at least the
    model's (``model_half_width``, relative)."""
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
        ratio = predict(model, s, gpu, params)[0] / predict(model, s, theirs, params)[0]
        values.append(r["seconds_per_step"] * ratio)
    if not values:
        return None
    seconds = statistics.median(values)
    spread = max(MEASURED_SPREAD, (max(values) - min(values)) / 2 / seconds) if len(values) > 1 else MEASURED_SPREAD
    if not same:  # carried over from another GPU: the model's GPU ratio adds its own error
        spread = max(spread, model_half_width)
    matches = tuple(Match(r["job_id"], r["gpu_name"], r["seconds_per_step"], r["peak_gb"], r["gpu_name"] == gpu.name)
                    for r in use)
    return seconds, spread, matches
