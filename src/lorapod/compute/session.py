"""The whole life of a remote job: one readable sequence of its stages, every wait bounded.

``acquire`` (:mod:`~lorapod.compute.acquire`: ledger row -> create, never blindly retried -> wait
for SSH, else destroy and the next offer) -> ``start_watchdog`` and ``provision``
(:mod:`~lorapod.compute.provision`: the watchdog first, then bootstrap, sync, start the job
detached) -> ``follow`` (:mod:`~lorapod.compute.follow`: metrics, caps, pulls as things appear,
the final pull verified by size + sha256, PULLED) -> ``teardown``
(:mod:`~lorapod.compute.teardown`: destroy, confirmed by the provider, then the ledger).

Teardown is guaranteed from several sides: a ``finally`` here; SIGINT/SIGTERM handlers that turn
into the same orderly stop (a second one skips straight to destroy and ends this process after
the destroy call); the on-instance watchdog (:mod:`lorapod.compute.watchdog`), running from the
moment SSH answers, if this process dies; and ``lorapod down --orphans``. A destroy the provider
does not confirm is never reported as success: :attr:`Summary.unconfirmed` names the instance.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from lorapod.compute.acquire import Lease
from lorapod.compute.context import Interrupted, JobContext, RunOptions
from lorapod.compute.follow import Follower, Progress
from lorapod.compute.ledger_repair import backup as backup_ledger
from lorapod.compute.offers import planned_job
from lorapod.compute.provider import Provider
from lorapod.compute.provision import Watched, open_work, provision, start_watchdog
from lorapod.compute.pulls import PullGuard
from lorapod.compute.pulls import cap_bytes as pull_cap_bytes
from lorapod.compute.recovery import Preempted, SpotRun, SpotStop, check_preempted, clear_remote_run
from lorapod.compute.remote import RemoteWork
from lorapod.compute.teardown import salvage, teardown
from lorapod.errors import BudgetError, LorapodError
from lorapod.rundir import RunDir, last_step, new_job_id
from lorapod.rundir.metrics import MetricsFeed
from lorapod.store.ledger import Ledger, LedgerBusy
from lorapod.store.preemptions import job_figures

if TYPE_CHECKING:
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec


@dataclass
class Summary:
    job_id: str
    run_dir: Path
    state: str  # done | stopped | failed | interrupted
    last_step: int | None
    usd: float
    message: str
    first_step_s: float | None = None  # seconds from start to the first metrics line
    billed_after_pull_s: float | None = None  # seconds the instance lived after the last pull
    unconfirmed: str | None = None  # provider id of an instance whose destroy was not confirmed
    console: str | None = None  # where to check it by hand
    #: on spot: preemptions, what they cost, what spot saved vs on-demand (store/preemptions.py)
    spot: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "run_dir": str(self.run_dir), "state": self.state,
                "last_step": self.last_step, "usd": round(self.usd, 4), "message": self.message,
                "first_step_s": self.first_step_s, "billed_after_pull_s": self.billed_after_pull_s,
                "unconfirmed": self.unconfirmed, "console": self.console, "wandb_url": self.wandb_url,
                "spot": self.spot, "quality": self.quality}

    @property
    def quality(self) -> dict[str, Any] | None:
        """The quality autopilot's pick and early stop, from the pulled quality/ (rundir/quality.py)."""
        from lorapod.rundir.quality import pick_summary

        return pick_summary(self.run_dir)

    @property
    def wandb_url(self) -> str | None:
        """The run's W&B page, from the pulled tracking.json (None: W&B off, or offline)."""
        from lorapod.engine.trackers import wandb_url

        return wandb_url(self.run_dir)


def _quality_line(root: Path, ledger: Ledger, job_id: str) -> str:
    """"; quality pick: step-600 at strength 0.8; stopped by train.stop_when at step 600 (...): 900
    planned steps not run, 41 min and $0.52 saved against the plan": the pulled decision, priced
    at the instance's rate; "" when the run has none."""
    from lorapod.rundir.quality import pick_summary, saved_line

    q = pick_summary(root)
    if q is None:
        return ""
    out = ""
    if q.get("checkpoint"):
        at = f" at strength {q['strength']:g}" if q.get("strength") is not None else ""
        out += f"; quality pick: {q['checkpoint']}{at}"
    if q.get("stopped"):
        rates = [i.usd_per_hour for i in ledger.job_instances(job_id) if i.usd_per_hour]
        out += "; " + saved_line(q["stopped"], rates[-1] if rates else None)
    return out


class Session:
    """One remote job: the run folder and ledger rows it owns, and :meth:`run_job`, its stages in order."""

    def __init__(self, spec: JobSpec, provider: Provider, target: str, opts: RunOptions | None = None,
                 ledger: Ledger | None = None, spec_path: str | None = None,
                 say: Callable[[str], None] = print, resume_job: str | None = None,
                 job: Job | EllipsisType | None = ...) -> None:
        """``job``: the planner's job for ``spec``, planned once by the caller (``prepare_run``;
        None: the planner cannot estimate it); ``...``: not planned yet, so planned here."""
        ledger = ledger or Ledger()
        self.spec_path = spec_path
        self.progress = Progress()
        if resume_job:
            row = ledger.job(resume_job)
            if row is None:
                raise LorapodError(f"no job '{resume_job}' in the ledger", hint="`lorapod ps` lists jobs")
            # One controller per run folder (rundir.WriterLock), taken before the ledger says
            # anything: it holds even when the ledger was rebuilt or another home names the folder.
            self._writer = RunDir(Path(row.run_dir)).lock(f"lorapod run --resume {row.id} ({target})", say=say)
            other = ledger.job_claim(row.id)  # this process follows it now: `ps`, `down --orphans`
            if other is not None:
                self._writer.release()
                raise LorapodError(f"job {row.id} is already followed by a running controller ({other})",
                                   hint=f"follow it with `lorapod logs -f {row.id}`, or stop it with "
                                        f"`lorapod down {row.id}`")
            run, job_id = RunDir(Path(row.run_dir)), row.id
            # The uploaded run folder carries the old metrics: follow only what is new (the feed's
            # floor is None: the job restarts at its checkpoint).
            offset = _end_of_last_line(run.metrics_file) if run.metrics_file.is_file() else 0
            self.progress = Progress(last_step=row.last_step, feed=MetricsFeed(offset=offset))
        else:
            run = RunDir.create(spec.output.dir, spec.output.name or "job")
            self._writer = run.lock(f"lorapod run {run.job_id} ({target})", say=say)
            job_id = run.job_id
            run.write_spec(spec)
            if opts and opts.trainer:
                run.write_trainer(opts.trainer)
        self.ctx = JobContext(spec, provider, target, opts or RunOptions(), ledger, run, job_id, say,
                              resume=bool(resume_job), job=planned_job(spec) if job is ... else job)
        self.job_id, self.run = job_id, run
        self.lease: Lease | None = None
        self.work: RemoteWork | None = None
        self.watched: Watched | None = None
        self.follower: Follower | None = None
        self._pulls: PullGuard | None = None
        self.billed_after_pull: float | None = None

    @property
    def stop_reason(self) -> str | None:
        """Why the job is being stopped (a sweep sets it before writing STOP itself)."""
        return self.progress.stop_reason

    @stop_reason.setter
    def stop_reason(self, reason: str | None) -> None:
        self.progress.stop_reason = reason

    def _pulls_for(self, work: RemoteWork) -> PullGuard:
        """Every pull goes through one guard: bounded, sparse-aware, free space checked first."""
        if self._pulls is None:
            plan_gb = self.lease.estimate.pull_gb if self.lease and self.lease.estimate else None
            python = (self.watched.boot if self.watched else self.ctx.opts.bootstrap).python
            self._pulls = PullGuard(work, self.run.root, python, pull_cap_bytes(self.ctx.spec, plan_gb),
                                    self.ctx.say)
        return self._pulls

    # ------------------------------------------------------------------ the sequence

    def run_job(self) -> Summary:
        ctx = self.ctx
        self._open()
        old = self._install_signal_handlers()
        state, message = "failed", "did not start"
        spot = self.spot = SpotRun(ctx, self.progress)
        ctx.preemption_check = lambda: check_preempted(ctx)
        try:
            lease = self.lease = spot.acquire()
            while True:
                try:
                    work = self.work = open_work(ctx, lease)
                    if spot.preemptions:  # the settled run folder from here is the only truth there
                        clear_remote_run(ctx, work)
                    watched = self.watched = start_watchdog(ctx, lease, work)
                    started = provision(ctx, lease, work, watched)
                    self.follower = Follower(ctx, lease, work, watched, started, self.progress,
                                             self._pulls_for(work))
                    state, message = self.follower.follow()
                    break
                except LorapodError as exc:
                    pre = self._as_preemption(exc)
                    if pre is None:
                        raise
                    self._left_instance()
                    try:
                        lease = self.lease = spot.recover(lease, pre)
                    except SpotStop as stop:
                        self.lease = None
                        self.progress.stop_reason = stop.message
                        state, message = "stopped", f"stopped at step {self.progress.last_step}: {stop.message}"
                        break
                    self._resume_from_here()
        except Interrupted as exc:
            state, message = "interrupted", str(exc.message)
            if self.follower is not None:  # None: the job never ran, nothing to checkpoint or pull
                self.follower.stop_in_order("interrupted")
        except BaseException as exc:
            state, message = "failed", exc.message if isinstance(exc, LorapodError) else f"{type(exc).__name__}: {exc}"
            if self.work is not None:
                salvage(ctx, self._pulls_for(self.work))
            raise
        finally:
            try:
                ctx.in_teardown = True
                if self.watched is not None:
                    self.watched.heartbeat.set()
                p = self.progress
                self.billed_after_pull = teardown(ctx, self.work, why=p.stop_reason or "job over", pulled=p.pulled,
                                                  keep_results=p.disk_full, last_pull_at=p.last_pull_at,
                                                  watchdog_started=self.watched is not None)
                if self.lease is not None and ctx.claim is None:  # destroyed: its life on spot, for the rates
                    spot.job_ended(self.lease)
            finally:
                self._writer.release()
                self._restore_signal_handlers(old)
                self.summary = self._close(state, message)
        return self.summary

    def _as_preemption(self, exc: LorapodError) -> Preempted | None:
        """Whatever a stage raised on an interruptible instance (an rsync killed mid-pull, a
        command cut off, a job that died), the provider is asked before it counts as a failure:
        the :class:`Preempted` it says it was, or None."""
        if isinstance(exc, Preempted):
            return exc
        if isinstance(exc, Interrupted | BudgetError):
            return None
        ruled_out = self.ctx.preempt_ruled_out_at
        recent = ruled_out is not None and time.monotonic() - ruled_out < 60  # the follower just waited
        try:
            check_preempted(self.ctx, 0.0 if recent else self.ctx.opts.preempt_confirm_s)
        except Preempted as pre:
            self.ctx.say(f"{exc.message.splitlines()[0] if exc.message else type(exc).__name__}: the instance was "
                         "preempted")
            return pre
        return None

    def _left_instance(self) -> None:
        """The instance was taken back: its heartbeat, connection and followers are of no more use."""
        if self.watched is not None:
            self.watched.heartbeat.set()
        if self.lease is not None:
            with contextlib.suppress(Exception):
                self.lease.transport.close()
        self.work = self.watched = self.follower = None
        self._pulls = None

    def _resume_from_here(self) -> None:
        """The next instance continues from the settled local run folder (compute/recovery.py):
        uploaded when it holds a checkpoint, the metrics feed following from its end."""
        from lorapod.compute.recovery import resume_offset

        has_ckpt = any(not c.name.startswith(".") for c in self.run.checkpoints.glob("*-*"))
        self.ctx.resume = has_ckpt
        p = self.progress
        p.feed = MetricsFeed(offset=resume_offset(self.run.root) if has_ckpt else 0)
        p.pulled, p.last_pull_at = False, None

    def _open(self) -> None:
        """The job's ledger row, and the refusals that must come before anything is rented."""
        ctx, ledger = self.ctx, self.ctx.ledger
        ctx.max_usd = ctx.opts.max_usd or ctx.spec.compute.max_usd
        ctx.max_hours = ctx.opts.max_hours or ctx.spec.compute.max_hours
        if ctx.resume:
            ledger.job_update(self.job_id, state="starting", ended_at=None)
        else:
            ledger.job_started(self.job_id, str(self.run.root), ctx.provider.name, ctx.target,
                               self.spec_path, ctx.max_usd, ctx.max_hours)
        if ledger.pending:  # locked (or unwritable) before anything is rented: say so now, rent nothing
            self._writer.release()
            raise LedgerBusy(f"the ledger {ledger.path} is locked by another process (or cannot be written); "
                             f"job {self.job_id} was not started and nothing was rented",
                             hint="close the program holding it (a `sqlite3` shell, a backup), or free the disk / "
                                  "make LORAPOD_HOME writable, then run again")
        if ctx.max_usd is not None and ledger.usd(self.job_id) >= ctx.max_usd:
            raise BudgetError(f"job {self.job_id} already spent ${ledger.usd(self.job_id):.2f} of ${ctx.max_usd:.2f}",
                              hint="raise --max-usd to continue")
        if ledger.notice:
            ctx.emit(f"warning: {ledger.notice}")
        with contextlib.suppress(OSError, sqlite3.Error):  # a backup that fails never stops a run
            backup_ledger(ledger)

    def _close(self, state: str, message: str) -> Summary:
        """The job's end in the ledger and the summary the caller prints."""
        ctx, ledger, p = self.ctx, self.ctx.ledger, self.progress
        usd = ledger.usd(self.job_id)
        resume = f"; resume with `lorapod run --resume {self.job_id}`" if state != "done" else ""
        if state != "done" and p.disk_full and not any(self.run.checkpoints.glob("*-*")):
            resume = "; no checkpoint reached this machine (its disk is full), so nothing here resumes"
        msg = f"{message} ({last_step(p.last_step)}, ${usd:.4f}){resume}"
        if p.feed.dropped_total:
            msg += f"; {p.feed.dropped_total} metrics line(s) from the instance ignored"
        if ctx.unconfirmed:
            msg += (f"; instance {ctx.unconfirmed} NOT confirmed destroyed: check "
                    f"{ctx.console_link()} and run `lorapod down {self.job_id}`")
        fig = job_figures(ledger, self.job_id)
        if fig is not None:
            msg += f"; {fig.line()}"
        msg += _quality_line(self.run.root, ledger, self.job_id)
        ledger.job_ended(self.job_id, state, msg)
        ledger.job_update(self.job_id, last_step=p.last_step)
        self._learn()
        if not ledger.flush(wait_s=ledger.busy_s):
            msg += (f"; the ledger stayed locked by another process and {ledger.pending} "
                    "record(s) of this job were not written: once it is free, `lorapod down "
                    "--orphans` reconciles it with the provider")
        return Summary(self.job_id, self.run.root, state, p.last_step, usd, msg,
                       p.first_step_at - ctx.t0 if p.first_step_at else None, self.billed_after_pull,
                       ctx.unconfirmed, ctx.console_link() if ctx.unconfirmed else None,
                       fig.to_json() if fig is not None else None)

    def _learn(self) -> None:
        """Measure the ended job for the planner now (plan/learned.py), not at the next plan; never
        in the way of the summary: a run it cannot read is only logged."""
        from lorapod.plan.learned import record_job

        try:
            record_job(self.ctx.ledger, self.job_id)
        except (LorapodError, OSError, sqlite3.Error) as exc:
            self.ctx.ledger.event("job", f"not measured for the planner: {exc}", job_id=self.job_id)

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        ctx = self.ctx

        def handler(signum: int, frame: Any) -> None:
            # 1st: orderly stop (checkpoint, pull, destroy). 2nd: skip the pull. During teardown:
            # never interrupted, because that is the part that stops the bill.
            ctx.signals += 1
            if ctx.in_teardown:
                ctx.emit("destroying the instance; please wait" if ctx.signals < 2 else
                         "stopping after this destroy call, confirmed or not")
                return
            if ctx.signals == 1:
                raise Interrupted(f"stopped by {signal.Signals(signum).name}")
            if ctx.signals == 2:
                raise Interrupted("interrupted again: skipping the final pull")

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def _restore_signal_handlers(self, old: dict[int, Any]) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)


def _end_of_last_line(path: Path, chunk: int = 1 << 16) -> int:
    """The offset just after the last newline of ``path``, read backwards in bounded chunks
    (the pulled metrics file may be large; it is never read whole)."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            cut = fh.read(pos - start).rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            pos = start
    return 0


def run_remote(spec: JobSpec, provider: Provider, target: str, opts: RunOptions | None = None,
               ledger: Ledger | None = None, spec_path: str | None = None, say: Callable[[str], None] = print,
               resume_job: str | None = None, job: Job | EllipsisType | None = ...) -> Summary:
    """Run ``spec`` on ``provider`` and bring the run folder home; see :class:`Session`."""
    return Session(spec, provider, target, opts, ledger, spec_path, say, resume_job, job).run_job()


__all__ = ["Interrupted", "RunOptions", "Session", "Summary", "new_job_id", "run_remote"]
