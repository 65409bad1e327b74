"""Sweeps: many jobs from one spec and a grid, through the same remote lifecycle, under one budget.

``--grid train.learning_rate=1e-4,2e-4 --grid method.r=8,16`` gives the cartesian product (4
jobs), each a :class:`~lorapod.compute.session.Session` of its own (create, watchdog, follow,
pull, destroy), at most ``parallel`` at once, spread over the targets given (round robin over
the least busy).

The total dollar cap is split, never overrun: when a job starts it is *allotted* an equal share
of what is left (the cap less what finished jobs spent and what running jobs hold), or its
planner estimate when that is larger and still fits; the allotment is that job's own
``max_usd``, so the session checkpoints and stops it before crossing it. The sum of allotments
never exceeds the cap, so no new job starts that could cross it and running jobs stop at it. A
job whose estimate is over what is left is not started; an allotment returns to the pool (less
what was spent) when its job ends.

Results are ranked by the last validation loss (``val_loss``, or ``fixed_noise_loss`` for image
LoRAs), then dollars; the winner's adapter is copied into the sweep folder.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.compute.offers import planned_job
from lorapod.compute.provider import Provider, on_hint
from lorapod.compute.session import RunOptions, Session
from lorapod.errors import LorapodError, SpecError
from lorapod.rundir import METRICS, new_job_id, read_records
from lorapod.rundir import last_loss as records_last_loss
from lorapod.spec import JobSpec, load_spec
from lorapod.store.ledger import Ledger

if TYPE_CHECKING:
    from lorapod.plan.job import Job

MIN_ALLOTMENT_USD = 0.01  # below a cent a job cannot do anything useful
# A job is started only if its allotment pays for this many stop margins on the cheapest offer:
# one is what the orderly stop (checkpoint, pull, destroy) needs, the rest is for work.
MIN_MARGINS = 2.0


def expand_grid(grid: Sequence[str]) -> list[dict[str, str]]:
    """``["a=1,2", "b=x,y"]`` -> the 4 combinations, in order (the last key varies fastest)."""
    axes: list[tuple[str, list[str]]] = []
    for item in grid:
        key, sep, values = item.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not vals:
            raise SpecError(f"--grid {item!r} is not KEY=V1,V2,...", hint="e.g. --grid train.learning_rate=1e-4,2e-4")
        if key.strip() in dict(axes):
            raise SpecError(f"--grid names {key.strip()} twice", hint="give each key once, with all its values")
        axes.append((key.strip(), vals))
    if not axes:
        raise SpecError("a sweep needs at least one --grid KEY=V1,V2")
    return [dict(zip([k for k, _ in axes], combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]


def job_specs(spec: JobSpec, grid: Sequence[str]) -> list[tuple[dict[str, str], JobSpec]]:
    """Each job of the grid: its overrides and its spec, named ``<output.name>-job<n>`` (n from 1). Not
    ``-<n>``: ``demo-2`` would be a prefix of a dated id ``demo-20261205-...``, and ids are typed by
    their prefix (``lorapod logs demo-2``)."""
    name = spec.output.name or "sweep"
    return [(ov, load_spec(raw=spec.model_dump(mode="json"),
                           overrides=[*(f"{k}={v}" for k, v in ov.items()), f"output.name={name}-job{i}"]))
            for i, ov in enumerate(expand_grid(grid), 1)]


@dataclass
class SweepJob:
    index: int
    overrides: dict[str, str]
    target: str = ""
    state: str = "pending"  # pending | running | done | stopped | failed | interrupted | skipped
    job_id: str | None = None
    run_dir: str | None = None
    allotted_usd: float | None = None
    estimate_usd: float | None = None
    usd: float = 0.0
    seconds: float = 0.0
    loss_key: str | None = None
    loss: float | None = None
    message: str = ""

    @property
    def label(self) -> str:
        return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.overrides.items())


@dataclass
class SweepResult:
    root: Path
    jobs: list[SweepJob]
    max_usd: float | None
    winner: SweepJob | None = None
    winner_adapter: Path | None = None
    stopped: str | None = None  # why the sweep stopped early (interrupted)
    notes: list[str] = field(default_factory=list)

    @property
    def ranked(self) -> list[SweepJob]:
        def key(j: SweepJob) -> tuple:
            return (j.loss is None, j.loss if j.loss is not None else 0.0, j.state == "skipped", j.usd, j.index)

        return sorted(self.jobs, key=key)

    @property
    def usd(self) -> float:
        return sum(j.usd for j in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "max_usd": self.max_usd, "usd": round(self.usd, 4),
                "winner": self.winner.job_id if self.winner else None,
                "winner_adapter": str(self.winner_adapter) if self.winner_adapter else None,
                "stopped": self.stopped, "notes": self.notes,
                "ranked": [asdict(j) for j in self.ranked]}


def last_loss(run_dir: Path) -> tuple[str | None, float | None]:
    """The last validation-type loss a run logged (``val_loss`` or ``fixed_noise_loss``)."""
    return records_last_loss(read_records(run_dir / METRICS))


def estimate_usd(spec: JobSpec, target: str, job: Job | None) -> float | None:
    """The planner's dollars for this job (``job``: planned once, None when it cannot be) on the
    cheapest fitting offer the catalog prices for ``target``; None where the catalog has no prices
    for it (``local``, ``ssh://``, a plugin) or the planner cannot estimate the job. The same
    rule as a run's offers: decided by the catalog's data, never the target's name."""
    if job is None:
        return None
    try:
        from lorapod.plan.choose import plan_job

        best = plan_job(spec, provider=target, job=job).best
    except LorapodError:
        return None
    return best.usd_total if best else None


class Sweep:
    """Runs the grid's jobs; see the module docstring for how the budget is shared."""

    def __init__(self, spec: JobSpec, grid: Sequence[str], targets: Sequence[tuple[str, Provider]], *,
                 parallel: int = 1, max_usd: float | None = None, options: Callable[[], RunOptions] = RunOptions,
                 ledger_factory: Callable[[], Ledger] = Ledger, spec_path: str | None = None,
                 say: Callable[[str], None] = print, planned: Sequence[Job | None] = ()) -> None:
        """``planned``: each grid job's planned job, in order, when the caller planned them already
        (``prepare_sweep``); the others are planned here, once each."""
        if not targets:
            raise SpecError("a sweep needs somewhere to run", hint=f"--on {on_hint()}")
        if parallel < 1:
            raise SpecError("--parallel must be at least 1")
        self.spec = spec
        self.targets = list(targets)
        self.parallel = parallel
        self.max_usd = max_usd
        self.options = options
        self.ledger_factory = ledger_factory
        self.spec_path = spec_path
        self._say = say
        self.base_name = spec.output.name or "sweep"
        self.specs: list[JobSpec] = []
        self.jobs: list[SweepJob] = []
        for i, (ov, job_spec) in enumerate(job_specs(spec, grid), 1):
            self.specs.append(job_spec)
            self.jobs.append(SweepJob(i, ov))
        # each job's planned job, built once (its data read once)
        self._planned: dict[int, Job | None] = {i: job for i, job in enumerate(planned, 1)}
        self.root = Path(spec.output.dir) / new_job_id(f"sweep-{self.base_name}")
        self._sessions: dict[int, Session] = {}
        self._busy: dict[str, int] = {t: 0 for t, _ in self.targets}
        self._stop: str | None = None
        self._open: set[int] = set()  # jobs started and not yet collected by run()
        self._lock = threading.Lock()

    def say(self, msg: str) -> None:
        self._say(msg)

    # ------------------------------------------------------------------ budget

    def _left(self) -> float:
        """The cap less what ended jobs spent and what running jobs hold."""
        assert self.max_usd is not None
        # a job counts its allotment until this thread has collected it, then what it spent
        held = sum((j.allotted_usd or 0.0) if j.index in self._open else j.usd for j in self.jobs)
        return self.max_usd - held

    def _allot(self, job: SweepJob, spec: JobSpec, target: str, provider: Provider, waiting: int,
               free_slots: int) -> float | None:
        """This job's own cap, or None when it must not start (the reason goes in job.message)."""
        if self.max_usd is None:
            return None
        left = self._left()
        share = left / max(1, min(waiting, free_slots))
        if job.estimate_usd is not None and job.estimate_usd > left:
            job.message = f"not started: the planner's ${job.estimate_usd:.2f} is over the ${left:.2f} left of the cap"
            return -1.0
        allot = max(share, job.estimate_usd or 0.0)
        if allot < max(MIN_ALLOTMENT_USD, self._least_useful_usd(spec, target, provider, self._planned_job(job, spec))):
            job.message = f"not started: ${left:.2f} left of the ${self.max_usd:g} cap, too little for a job"
            return -1.0
        return allot

    def _least_useful_usd(self, spec: JobSpec, target: str, provider: Provider, planned: Job | None) -> float:
        """What MIN_MARGINS stop margins cost on the target's cheapest matching offer (0 if unknown)."""
        from lorapod.compute.offers import requirements

        try:
            rates = [o.usd_per_hour for o in provider.offers(requirements(spec, job=planned))]
        except LorapodError:
            return 0.0
        return min(rates, default=0.0) * MIN_MARGINS * self.options().stop_margin_s / 3600

    # ------------------------------------------------------------------ running

    def _target(self) -> tuple[str, Provider]:
        target, provider = min(self.targets, key=lambda tp: self._busy[tp[0]])
        return target, provider

    def _planned_job(self, job: SweepJob, spec: JobSpec) -> Job | None:
        if job.index not in self._planned:
            self._planned[job.index] = planned_job(spec)
        return self._planned[job.index]

    def _run_one(self, job: SweepJob, spec: JobSpec, target: str, provider: Provider) -> None:
        opts = self.options()
        opts.max_usd = job.allotted_usd
        t0 = time.monotonic()
        ledger = self.ledger_factory()
        try:
            session = Session(spec, provider, target, opts, ledger, self.spec_path,
                              say=lambda m: self._say(f"[{job.index}] {m}"), job=self._planned_job(job, spec))
            job.job_id, job.run_dir = session.job_id, str(session.run.root)
            with self._lock:
                self._sessions[job.index] = session
                stop = self._stop
            if stop:
                raise LorapodError(f"not started: {stop}")
            summary = session.run_job()
            job.state, job.message = summary.state, summary.message
        except LorapodError as exc:
            job.state, job.message = "failed", exc.message
        except Exception as exc:  # one job's bug must not take the others' teardown with it
            job.state, job.message = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            job.seconds = time.monotonic() - t0
            if job.job_id:
                job.usd = ledger.usd(job.job_id)
            if job.run_dir:
                job.loss_key, job.loss = last_loss(Path(job.run_dir))

    def stop(self, reason: str) -> None:
        """Start nothing more; ask every running job to checkpoint and stop (they then pull and destroy)."""
        with self._lock:
            self._stop = reason
            sessions = list(self._sessions.values())
        for s in sessions:
            work = s.work
            if work is not None and not s.stop_reason:
                with contextlib.suppress(Exception):
                    s.stop_reason = reason
                    work.request_stop(reason)

    def run(self) -> SweepResult:
        self.root.mkdir(parents=True, exist_ok=True)
        result = SweepResult(self.root, self.jobs, self.max_usd)
        for job, spec in zip(self.jobs, self.specs, strict=True):
            if self.max_usd is not None:
                job.estimate_usd = estimate_usd(spec, self._target()[0], self._planned_job(job, spec))
        cap = f" under ${self.max_usd:g}" if self.max_usd is not None else ""
        self.say(f"sweep {self.root.name}: {len(self.jobs)} jobs, {self.parallel} at a time{cap}")
        old = self._install_signal_handlers()
        pending = list(zip(self.jobs, self.specs, strict=True))
        running: dict[Future, tuple[SweepJob, str]] = {}
        try:
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="lorapod-sweep") as pool:
                while pending or running:
                    while pending and len(running) < self.parallel and not self._stop:
                        job, spec = pending.pop(0)
                        target, provider = self._target()
                        allot = self._allot(job, spec, target, provider, len(pending) + 1,
                                            self.parallel - len(running))
                        if allot is not None and allot < 0:
                            job.state = "skipped"
                            self.say(f"[{job.index}] {job.label}: {job.message}")
                            continue
                        job.target, job.allotted_usd, job.state = target, allot, "running"
                        self._busy[target] += 1
                        self._open.add(job.index)
                        self.say(f"[{job.index}] {job.label} on {target}"
                                 + (f" (allotted ${allot:.2f})" if allot is not None else ""))
                        running[pool.submit(self._run_one, job, spec, target, provider)] = (job, target)
                    if not running:
                        break
                    self._snapshot(result)
                    done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                    for fut in done:
                        job, target = running.pop(fut)
                        self._busy[target] -= 1
                        fut.result()
                        self._open.discard(job.index)
                        loss = f", {job.loss_key} {job.loss:.4f}" if job.loss is not None else ""
                        self.say(f"[{job.index}] {job.state}: ${job.usd:.4f}{loss}")
        finally:
            self._restore_signal_handlers(old)
        for job, _spec in pending:
            job.state, job.message = "skipped", f"not started: {self._stop}"
        result.stopped = self._stop
        self._finish(result)
        return result

    def _snapshot(self, result: SweepResult) -> None:
        """sweep.json while the sweep runs (rewritten each second, atomically), so that `lorapod ui`
        groups its jobs under the shared cap before the sweep ends; never fails the sweep."""
        from lorapod.fsutil import atomic_write_text

        with contextlib.suppress(OSError):
            atomic_write_text(self.root / "sweep.json", json.dumps(result.to_dict(), indent=2))

    def _finish(self, result: SweepResult) -> None:
        finished = [j for j in result.ranked if j.run_dir and (Path(j.run_dir) / "adapter").is_dir()]
        if finished:
            result.winner = finished[0]
            dest = self.root / "winner-adapter"
            shutil.copytree(Path(finished[0].run_dir) / "adapter", dest, dirs_exist_ok=True)  # type: ignore[arg-type]
            result.winner_adapter = dest
        else:
            result.notes.append("no job finished with an adapter")
        (self.root / "sweep.json").write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            self.say("interrupted: no new jobs; asking the running ones to checkpoint, pull and destroy")
            self.stop(f"sweep interrupted ({signal.Signals(signum).name})")

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _restore_signal_handlers(self, old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

