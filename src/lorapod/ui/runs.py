"""What the dashboard shows about runs, read from the ledger and the run folders each time.

Two kinds of run: a job in the ledger (``lorapod run`` / ``sweep``, on any provider), described
by the same rows as ``lorapod ps`` (:func:`lorapod.compute.jobs.ps_rows`), and a run folder that
no ledger knows (``lorapod train`` or ``lorapod demo`` on this machine), found under the folders
given to ``lorapod ui``. Nothing here writes anything.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorapod.rundir.layout import CHECKPOINTS, METRICS, SAMPLE_EXTS, answers_tag, sample_parts
from lorapod.rundir.metrics import parse_records
from lorapod.ui.files import is_real_dir, list_files, read_text

ACTIVE = ("starting", "running", "stopping")
#: A local run folder whose metrics changed this recently counts as running.
LOCAL_LIVE_S = 120.0
#: Folders never searched for run folders.
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "checkpoints", "samples", "adapter",
             "exports", "tensorboard", "eval", "data", "base-model"}
SCAN_DEPTH = 3
#: Bytes at the end of metrics.jsonl read for the Runs page's step, loss and ETA.
PROGRESS_TAIL = 128 * 1024
#: Points per chart series sent to the browser; longer series are downsampled to this.
MAX_POINTS = 1500
#: The longest ETA or planned duration a page shows (a year). A host writes the metrics and the
#: plan of a remote run: a step time of 1e308 s or 1e14 s must not reach the page's clock and
#: duration filters (``time.localtime`` raises past year 9999; ``int(inf)`` raises).
MAX_SHOWN_S = 365 * 86400.0
CHART_KEYS = {
    "loss": ("loss", "val_loss", "fixed_noise_loss"),
    "lr": ("lr",),
    "speed": ("tokens_per_s", "it_per_s", "samples_per_s"),
    # the quality autopilot's line at each scored checkpoint (quality/autopilot.py): score and parts vs the base
    "quality": ("quality_score", "quality_fidelity", "quality_adherence", "quality_leakage", "quality_loss_gain",
                "quality_f1_delta"),
}


@dataclass
class RunView:
    """One row of the Runs page and the head of a run's page."""

    job_id: str
    root: Path
    in_ledger: bool
    state: str
    provider: str
    target: str
    gpu: str | None = None
    usd_per_hour: float | None = None
    usd: float = 0.0
    max_usd: float | None = None
    max_hours: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    last_step: int | None = None
    total_steps: int | None = None
    last_loss: float | None = None
    plan_usd: float | None = None
    plan_hours: float | None = None
    eta_s: float | None = None
    finish_usd: float | None = None
    unconfirmed: list[str] = field(default_factory=list)
    console_url: str | None = None
    live_instances: int = 0
    summary: str | None = None
    sweep: str | None = None
    setup_s: dict[str, float] = field(default_factory=dict)
    #: The spec the Plan and Data pages may read: the file `lorapod run` was given (the ledger's
    #: spec_path), or a local run folder's own spec.yaml; never a remote run folder's spec.yaml,
    #: which the pull brought back from the host.
    spec_file: Path | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE or self.live_instances > 0

    @property
    def cap_fraction(self) -> float | None:
        return min(1.0, self.usd / self.max_usd) if self.max_usd else None

    @property
    def progress(self) -> float | None:
        if self.total_steps and self.last_step is not None:
            return min(1.0, self.last_step / self.total_steps)
        return None

    @property
    def setup_usd(self) -> dict[str, float]:
        rate = self.usd_per_hour or 0.0
        return {k: s / 3600 * rate for k, s in self.setup_s.items()}


def console_url(provider: str) -> str | None:
    """The provider's own console page (its declared ``traits.console_url``), where a person can
    check and destroy an instance by hand; None for hosts without one (ssh, local)."""
    from lorapod.compute.provider import declared_traits

    traits = declared_traits(provider)
    return traits.console_url if traits else None


# ----------------------------------------------------------------------------- reading a run folder


def read_metrics(root: Path, limit: int = 4 * 1024 * 1024) -> list[dict[str, Any]]:
    """The valid records in the last ``limit`` bytes of metrics.jsonl (the Compare page's last
    validation loss): read inside the run folder only (ui/files.py), parsed by the one reader
    (rundir/metrics.py), as every consumer of the file is."""
    return parse_records(read_text(root, METRICS, limit=limit, tail=True) or "")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int past a float's range (JSON allows 10**400)
        return None
    return f if math.isfinite(f) else None


def no_step_none(summary: str | None) -> str | None:
    """A ledger written before rundir.at_step: "at step None" said as the CLI says it now."""
    if not summary:
        return summary
    return summary.replace("at step None", "before its first step").replace("last step None", "no step yet")


def _step(v: Any) -> int | None:
    """A step number as the metrics feed accepts one (rundir/metrics.py): 0..MAX_STEP."""
    from lorapod.rundir.metrics import MAX_STEP

    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def bounded_s(v: float | None) -> float | None:
    """A duration a page may show: finite, 0..:data:`MAX_SHOWN_S`; None (shown as "-") otherwise."""
    return v if v is not None and math.isfinite(v) and 0 <= v <= MAX_SHOWN_S else None


def read_spec(root: Path) -> dict[str, Any]:
    text = read_text(root, "spec.yaml", limit=1024 * 1024)
    try:
        got = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return {}
    return got if isinstance(got, dict) else {}


def spec_dict(path: Path | None) -> dict[str, Any]:
    """A spec file as a plain mapping (1 MB at most); {} when absent or not YAML."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as fh:
            got = yaml.safe_load(fh.read(1024 * 1024).decode("utf-8", errors="replace"))
    except (OSError, yaml.YAMLError):
        return {}
    return got if isinstance(got, dict) else {}


def read_json(root: Path, rel: str, limit: int = 8 * 1024 * 1024) -> Any:
    text = read_text(root, rel, limit=limit)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _total_steps(root: Path, spec: dict[str, Any]) -> int | None:
    plan = read_json(root, "plan.json")
    job = plan.get("job") if isinstance(plan, dict) else None
    steps = _step(job.get("steps")) if isinstance(job, dict) else None
    if steps:
        return steps
    ms = (spec.get("train") or {}).get("max_steps") if isinstance(spec.get("train"), dict) else None
    return _step(ms) or None


def _plan_estimate(root: Path, gpu: str | None, provider: str) -> tuple[float | None, float | None]:
    """The planner's $ and hours for this job: the option it ran on, else the #1 option."""
    plan = read_json(root, "plan.json")
    if not isinstance(plan, dict) or not isinstance(plan.get("options"), list):
        return None, None
    opts = [o for o in plan["options"] if isinstance(o, dict)]
    same = [o for o in opts if o.get("gpu") == gpu and o.get("provider") == provider]
    pick = (same or [o for o in opts if o.get("fits")] or opts or [None])[0]
    if pick is None:
        return None, None
    usd, hours = _num(pick.get("usd_total")), _num(pick.get("hours_total"))
    if usd is None or hours is None or bounded_s(hours * 3600) is None:  # both, or neither (a host wrote it)
        return None, None
    return usd, hours


def fill_progress(view: RunView, metrics: list[dict[str, Any]] | None = None, now: float | None = None) -> None:
    """Last step, last loss, ETA and the $ at finish from the metrics (median of the last 50
    steps' time, or their wall-clock spacing), the planner's estimate from plan.json."""
    now = now or time.time()
    if metrics is None:  # the tail is enough (the last 50 steps), and stays fast for 10,000-row runs
        metrics = read_metrics(view.root, limit=PROGRESS_TAIL)
    spec = read_spec(view.root)
    view.total_steps = _total_steps(view.root, spec)
    steps = [r for r in metrics if _num(r.get("loss")) is not None and _step(r.get("step")) is not None]
    if steps:
        view.last_step = max(view.last_step or 0, steps[-1]["step"])
        view.last_loss = _num(steps[-1]["loss"])
    view.plan_usd, view.plan_hours = _plan_estimate(view.root, view.gpu, view.provider)
    if view.max_usd is None:
        cap = (spec.get("compute") or {}).get("max_usd") if isinstance(spec.get("compute"), dict) else None
        view.max_usd = _num(cap)
    recent = steps[-50:]
    dts = [d for d in (_num(r.get("step_time_s")) for r in recent) if d]
    if not dts and len(recent) > 1:
        dts = [(tb - ta) / max(1, b["step"] - a["step"]) for a, b in itertools.pairwise(recent)
               if (ta := _num(a.get("time"))) and (tb := _num(b.get("time"))) and tb > ta]
    if view.total_steps and view.last_step is not None and dts and view.state in ACTIVE:
        left = max(0, view.total_steps - view.last_step)
        view.eta_s = bounded_s(left * statistics.median(dts))  # None past a year: "-", never a 500
        if view.eta_s is not None:
            view.finish_usd = view.usd + view.eta_s / 3600 * (view.usd_per_hour or 0.0)


def sweeps(parents: set[Path]) -> list[dict[str, Any]]:
    """Every ``sweep.json`` beside the run folders: its jobs, the shared cap and what they spent."""
    out = []
    # one folder named two ways (a ledger's relative run_dir beside a scanned absolute one) is one folder
    unique = {}
    for parent in sorted(parents):
        unique.setdefault(os.path.realpath(parent), parent)
    for parent in unique.values():
        try:
            entries = [e for e in os.scandir(parent) if e.name.startswith("sweep-") and e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for e in sorted(entries, key=lambda e: e.name):
            data = read_json(Path(e.path), "sweep.json")
            if not isinstance(data, dict):
                continue
            jobs = [j.get("job_id") for j in data.get("ranked") or [] if isinstance(j, dict) and j.get("job_id")]
            out.append({"name": e.name, "max_usd": _num(data.get("max_usd")), "usd": _num(data.get("usd")) or 0.0,
                        "winner": data.get("winner"), "jobs": [str(j) for j in jobs]})
    return out


# ----------------------------------------------------------------------------- the index


class RunIndex:
    """The runs the dashboard knows: the ledger's jobs, then run folders found under ``roots``."""

    def __init__(self, roots: list[Path], ledger_path: Path | None = None) -> None:
        from lorapod.home import lorapod_home

        self.roots = [Path(r).resolve() for r in roots]
        self.ledger_path = ledger_path or lorapod_home() / "ledger.db"
        self.ledger_error: str | None = None  # why the last look at the ledger failed, for the page

    def ledger(self, write: bool = False):
        """A fresh connection (one per request); None when no ledger exists yet (the UI never makes
        one). Pages read it read-only (a damaged ledger is said, never repaired from a page view);
        ``write``: an action (pull, stop, destroy) that records what it did, as the CLI does."""
        from lorapod.store.ledger import Ledger

        if not self.ledger_path.is_file():
            return None
        return Ledger(self.ledger_path) if write else Ledger.read_only(self.ledger_path)

    def _local_folders(self) -> list[Path]:
        found: list[Path] = []

        def walk(d: Path, depth: int, into: list[Path]) -> None:
            if (d / "spec.yaml").is_file() and not (d / "spec.yaml").is_symlink() and (
                    (d / METRICS).is_file() or is_real_dir(d / CHECKPOINTS)):
                # a run folder never holds another: one that does is a demo's --out folder (a copy of
                # its run's spec and metrics.jsonl beside runs/), and the runs under it are the runs
                inner: list[Path] = []
                children(d, depth, inner)
                into.extend(inner or [d])
                return
            children(d, depth, into)

        def children(d: Path, depth: int, into: list[Path]) -> None:
            if depth >= SCAN_DEPTH:
                return
            try:
                subs = sorted(e.name for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
            except OSError:
                return
            for name in subs:
                if name not in SKIP_DIRS and not name.startswith("."):
                    walk(d / name, depth + 1, into)

        for r in self.roots:
            walk(r, 0, found)
        return found

    def views(self, progress: bool | str = True) -> list[RunView]:
        """Every run, running first; ``progress`` (True, or one job id) reads their metrics."""
        from lorapod.compute.jobs import ps_rows

        views: list[RunView] = []
        seen: set[str] = set()
        self.ledger_error = None
        from lorapod.store.ledger import LedgerDamaged

        try:
            ledger = self.ledger()
        except LedgerDamaged as exc:  # said, never repaired from a page view: the run folders still show
            ledger, self.ledger_error = None, f"the ledger {self.ledger_path} cannot be read ({exc.message}; {exc.hint})"
        except sqlite3.Error as exc:  # locked past its busy timeout
            ledger, self.ledger_error = None, f"the ledger {self.ledger_path} cannot be read ({exc})"
        if ledger is not None:
            try:
                for row in ps_rows(ledger):
                    job = ledger.job(row["job"])
                    # absolute, as the scanned folders are (a sweep records runs/NAME, relative)
                    v = RunView(job_id=row["job"], root=Path(os.path.abspath(row["run_dir"])), in_ledger=True, state=row["state"],
                                provider=job.provider if job else row["target"], target=row["target"],
                                gpu=row["gpu"], usd_per_hour=row["usd_per_hour"], usd=row["usd"],
                                max_usd=job.max_usd if job else None, max_hours=job.max_hours if job else None,
                                started_at=job.started_at if job else None, ended_at=job.ended_at if job else None,
                                last_step=row["last_step"], unconfirmed=list(row["unconfirmed"]),
                                live_instances=row["live_instances"], summary=no_step_none(row["summary"]),
                                setup_s=dict(row["setup_s"]))
                    v.console_url = console_url(v.provider)
                    v.spec_file = Path(job.spec_path).resolve() if job and job.spec_path else None
                    views.append(v)
                    seen.add(str(v.root.resolve()))
            except sqlite3.Error as exc:
                self.ledger_error = f"the ledger {self.ledger_path} cannot be read ({exc})"
            finally:
                ledger.close()
        now = time.time()
        for d in self._local_folders():
            if str(d.resolve()) in seen:
                continue
            seen.add(str(d.resolve()))
            mt = _mtime(d / METRICS)
            done = is_real_dir(d / "adapter")
            state = "done" if done else ("running" if mt and now - mt < LOCAL_LIVE_S else "ended")
            spec = read_spec(d)
            rate = _num((spec.get("compute") or {}).get("usd_per_hour")) if isinstance(spec.get("compute"), dict) else None
            started = _mtime(d / "spec.yaml")
            v = RunView(job_id=d.name, root=d, in_ledger=False, state=state, provider="local",
                        target="this machine (lorapod train)", usd_per_hour=rate, started_at=started,
                        ended_at=mt if state != "running" else None, spec_file=d / "spec.yaml")
            if rate and started:
                v.usd = max(0.0, ((v.ended_at or now) - started)) / 3600 * rate
            views.append(v)
        parents = {v.root.parent for v in views}
        group = {}
        for s in sweeps(parents):
            for j in s["jobs"]:
                group[j] = s["name"]
        for v in views:
            if progress is True or progress == v.job_id:
                fill_progress(v, now=now)
            v.sweep = group.get(v.job_id)
        views.sort(key=lambda v: (not v.active, -(v.started_at or 0)))
        return views

    def find(self, job_id: str) -> RunView | None:
        """The run named exactly ``job_id`` (a ledger job id or a run folder's name, which may hold
        spaces and other characters: the URL carries it percent-encoded), or None."""
        if not 0 < len(job_id) <= 255 or "/" in job_id or "\0" in job_id or job_id in (".", ".."):
            return None
        return next((v for v in self.views(progress=job_id) if v.job_id == job_id), None)


def _mtime(p: Path) -> float | None:
    try:
        return os.lstat(p).st_mtime
    except OSError:
        return None


# ----------------------------------------------------------------------------- charts


def downsample(xs: list[float], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``limit`` points that keep the shape: per bucket, the lowest and the highest point
    in step order (a loss spike survives), and the first and last points exactly."""
    n = len(xs)
    if n <= limit:
        return xs, ys
    buckets = max(1, (limit - 2) // 2)
    size = (n - 2) / buckets
    ox, oy = [xs[0]], [ys[0]]
    for b in range(buckets):
        lo, hi = 1 + int(b * size), 1 + int((b + 1) * size)
        if hi <= lo:
            continue
        seg = range(lo, hi)
        i_min = min(seg, key=lambda i: ys[i])
        i_max = max(seg, key=lambda i: ys[i])
        for i in sorted({i_min, i_max}):
            ox.append(xs[i])
            oy.append(ys[i])
    ox.append(xs[-1])
    oy.append(ys[-1])
    return ox, oy


def series(metrics: Iterable[dict[str, Any]], limit: int = MAX_POINTS) -> dict[str, dict[str, list[float]]]:
    """``{key: {"x": steps, "y": values}}`` for every charted key the metrics have, downsampled.
    ``metrics`` is read once: a generator keeps only the columns in memory, never every record."""
    out: dict[str, dict[str, list[float]]] = {}
    keys = [k for ks in CHART_KEYS.values() for k in ks]
    cols: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in keys}
    for rec in metrics:
        step = _num(rec.get("step"))
        if step is None:
            continue
        if "it_per_s" not in rec and _num(rec.get("step_time_s")) and "tokens_per_s" not in rec:
            rec = {**rec, "it_per_s": 1.0 / float(rec["step_time_s"])}
        for k in keys:
            v = _num(rec.get(k))
            if v is not None:
                cols[k][0].append(step)
                cols[k][1].append(v)
    for k, (xs, ys) in cols.items():
        if xs:
            dx, dy = downsample(xs, ys, limit)
            out[k] = {"x": dx, "y": dy}
    return out


# ----------------------------------------------------------------------------- samples and eval

SAMPLE_EXT = SAMPLE_EXTS


def samples(root: Path) -> list[dict[str, Any]]:
    """Sample files grouped per checkpoint tag (``step000200-00.png`` -> ``step000200``), newest
    tag first; each with its kind (image or video). Grids and contact sheets are left out."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, size, mtime in list_files(root, "samples"):
        if not name.lower().endswith(SAMPLE_EXT):
            continue
        parts = sample_parts(name)
        tag = parts[0] if parts else "samples"
        if parts and parts[1] in ("grid", "frames"):
            continue
        kind = "video" if name.lower().endswith((".mp4", ".webm")) else "image"
        groups.setdefault(tag, []).append({"name": name, "path": f"samples/{name}", "kind": kind, "size": size,
                                           "mtime": mtime})
    order = sorted(groups, key=lambda t: (max(s["mtime"] for s in groups[t]), t), reverse=True)
    return [{"tag": t, "files": groups[t]} for t in order]


#: bounds on what the Samples section reads of an LLM run's answers (the host wrote them)
ANSWERS_FILES = 20  # the newest saves
ANSWERS_FILE_BYTES = 256 * 1024
ANSWERS_PER_FILE = 50
ANSWER_CHARS = 4000


def answers(root: Path) -> list[dict[str, Any]]:
    """An LLM run's samples: the adapter's answers to ``samples.prompts`` at each save
    (``samples/<tag>-answers.jsonl``, engine/llm.py), newest first, each row {prompt, answer}.
    Read bounded (:data:`ANSWERS_FILES` files of :data:`ANSWERS_FILE_BYTES`, :data:`ANSWERS_PER_FILE`
    rows of :data:`ANSWER_CHARS` characters); a line that is not such an object is skipped."""
    found = [(mtime, name, tag) for name, _size, mtime in list_files(root, "samples")
             if (tag := answers_tag(name)) is not None]
    out = []
    for _mtime, name, tag in sorted(found, reverse=True)[:ANSWERS_FILES]:
        text = read_text(root, f"samples/{name}", limit=ANSWERS_FILE_BYTES) or ""
        rows = []
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("answer"), str):
                rows.append({"prompt": row["prompt"][:ANSWER_CHARS], "answer": row["answer"][:ANSWER_CHARS]})
            if len(rows) >= ANSWERS_PER_FILE:
                break
        if rows:
            out.append({"tag": tag, "rows": rows})
    return out


def sample_prompt(root: Path, rel: str) -> str | None:
    """The prompt the engine wrote into a sample PNG (engine/diffusion/samples.py ``png_info``:
    a ``prompt`` text chunk, which Pillow writes as tEXt, or iTXt when it is not Latin-1).
    Pillow reads the chunks before the image data into ``info`` without decoding any pixels."""
    if not rel.lower().endswith(".png"):
        return None
    from PIL import Image, UnidentifiedImageError

    from lorapod.ui.files import Refused, open_inside

    try:
        fd = open_inside(root, rel)
    except Refused:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            with Image.open(fh, formats=["PNG"]) as im:
                prompt = im.info.get("prompt")
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            return None
    return str(prompt)[:4000] if prompt is not None else None


def evaluation(root: Path) -> dict[str, Any]:
    """The eval outputs: LLM (eval/eval.json: rows, recommended checkpoint, answers base vs
    tuned) and images (eval/images.json: one grid per prompt)."""
    out: dict[str, Any] = {}
    llm = read_json(root, "eval/eval.json")
    if isinstance(llm, dict):
        out["llm"] = llm
    img = read_json(root, "eval/images.json")
    if isinstance(img, dict):
        out["images"] = img
    return out


def quality(root: Path) -> dict[str, Any] | None:
    """The quality autopilot's decision for the run page (quality/, read bounded: rundir/quality.py):
    the pick and its reason, the early stop in words, and the score per checkpoint. None without one."""
    from lorapod.rundir import quality as files
    from lorapod.rundir.metrics import number

    summary = files.pick_summary(root)
    if summary is None:
        return None
    pick = files.read_json(root, files.PICK) or {}
    rows = []
    for t in (pick.get("table") or [])[:500]:
        if not isinstance(t, dict):
            continue
        best = t.get("best") if isinstance(t.get("best"), dict) else {}
        copies = t.get("memorised") if isinstance(t.get("memorised"), list) else []
        rows.append({"checkpoint": str(t.get("checkpoint"))[:60], "score": number(best.get("score")),
                     "se": number(best.get("se")), "strength": number(best.get("strength")),
                     "copies": ", ".join(str(c)[:8] for c in copies[:8])})
    models: dict[str, str] = {}
    scores = files.read_scores(root)
    if scores and isinstance(scores[-1].get("models"), dict):
        models = {str(k)[:20]: str(v)[:200] for k, v in list(scores[-1]["models"].items())[:8]}
    step = pick.get("step") if isinstance(pick.get("step"), int) and not isinstance(pick.get("step"), bool) else None
    stopped = summary.get("stopped")
    return {**summary, "step": step, "rows": rows, "models": models,
            "stopped_line": files.saved_line(stopped, None) if stopped else None}


def logs(root: Path) -> dict[str, str]:
    """The tails of the events, job and watchdog logs (64 KB each)."""
    out = {}
    for name in ("events.log", "job.log", "watchdog.log"):
        text = read_text(root, name, limit=64 * 1024, tail=True)
        if text:
            out[name] = text
    return out
