"""Follow: read the running job until it ends, and bring its results home verified.

Each poll reads a bounded chunk of metrics (validated by :mod:`~lorapod.rundir.metrics`),
checks that the watchdog lives (restarting it a bounded number of times), stops the job before a
cap, and pulls every ``pull_every_s``. When the job is done: the final pull, verified by size and
sha256 against the instance's own list, then PULLED. What the follower has seen is one
:class:`Progress`, which the summary and teardown read.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from lorapod.compute.acquire import Lease
from lorapod.compute.context import Interrupted, JobContext
from lorapod.compute.guards import beat_limit_s, restart_watchdog
from lorapod.compute.provision import Started, Watched, watchdog_config
from lorapod.compute.pulls import LocalDiskFull, PullGuard
from lorapod.compute.remote import RemoteWork, WatchdogNotRunning, local_manifest
from lorapod.compute.teardown import fetch_logs, mark_keep
from lorapod.compute.trust import safe_relpath
from lorapod.compute.wait import deadline_in
from lorapod.errors import LorapodError, RemoteError
from lorapod.rundir import at_step
from lorapod.rundir.metrics import POLL_BYTES, MetricsFeed


@dataclass
class Progress:
    """What the controller knows of the job so far (on --resume it starts from the ledger)."""

    last_step: int | None = None
    feed: MetricsFeed = field(default_factory=MetricsFeed)
    first_step_at: float | None = None  # monotonic
    last_pull_at: float | None = None  # monotonic
    stop_reason: str | None = None
    stop_requested_at: float | None = None
    pulled: bool = False  # the final pull was verified and PULLED written
    disk_full: bool = False  # this machine's disk could not take the results (compute/pulls.py)
    total_steps: int | None = None  # as the job's metrics say
    #: wall time each step was first seen (a spot run's lost work is measured from it), and of the
    #: first step on each instance (ledger id: its setup ends there)
    seen_at: dict[int, float] = field(default_factory=dict)
    instance_first_step: dict[str, float] = field(default_factory=dict)

    def seconds_per_step(self) -> float | None:
        """Seconds per step as seen: the median over consecutive steps seen in order."""
        steps = sorted(self.seen_at.items())
        pairs = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(steps) if b[1] >= a[1]]
        if not pairs:
            return None
        pairs.sort()
        return pairs[len(pairs) // 2]

    @property
    def metrics_offset(self) -> int:
        return self.feed.offset


@dataclass
class _WatchdogWatch:
    """The controller's side of invariant 9: since when the watchdog is unseen, restarts so far."""

    unknown_since: float | None = None
    grace_until: float = 0.0
    restarts: int = 0
    down_said: bool = False


class Follower:
    def __init__(self, ctx: JobContext, lease: Lease, work: RemoteWork, watched: Watched, started: Started,
                 progress: Progress, pulls: PullGuard) -> None:
        self.ctx, self.lease, self.work, self.watched, self.started = ctx, lease, work, watched, started
        self.progress, self.pulls = progress, pulls
        self.view: Any = None  # engine.progress.MetricsView, made when the first metrics arrive (max_usd known)
        self.lines: Any = None  # engine.progress.LineEvery: piped, a line every 30 s as `lorapod train` prints
        self.wd = _WatchdogWatch()

    def follow(self) -> tuple[str, str]:
        """Until the job is done (or stopped): returns (state, message), or raises with what to do."""
        ctx, o, p, work = self.ctx, self.ctx.opts, self.progress, self.work
        next_pull = time.monotonic() + o.pull_every_s
        beat_s = beat_limit_s(self.watched.watchdog)
        while True:
            st = ctx.remote(lambda: work.poll(p.metrics_offset, limit=POLL_BYTES, watchdog_beat_s=beat_s), "poll")
            more = self.take_metrics(st.metrics)
            self._check_watchdog(st)
            if st.gone:
                self._unless_preempted()
                raise RemoteError("the job's work folder vanished on the instance (the watchdog or someone "
                                  "removed it)", hint="see `lorapod logs JOB`; resume with `lorapod run --resume JOB`")
            if st.done and self._destroyed_elsewhere():
                # `lorapod down JOB` (or the dashboard's Destroy) took the instance while the job ran:
                # job.sh passes the destroy's SIGTERM on, so the job may end (exit 143) a poll before
                # its folder is gone; that is the destroy, not a failure of the job
                raise RemoteError("the job's instance was destroyed while it ran (`lorapod down` or the dashboard), "
                                  "so its work folder vanished", hint="resume with `lorapod run --resume JOB`")
            if st.stop and not p.stop_reason:
                p.stop_reason = f"the watchdog asked the job to stop: {st.stop}"
                p.stop_requested_at = time.monotonic()
                ctx.say(p.stop_reason)
            if st.done and not more:  # done, and every metrics line read
                break
            self._check_budget()
            if p.stop_requested_at and time.monotonic() - p.stop_requested_at > o.stop_wait_s:
                ctx.say(f"the job did not stop within {o.stop_wait_s:.0f} s of STOP; stopping it")
                break
            if time.monotonic() >= next_pull:
                try:
                    self._pull("progress")
                except LocalDiskFull as exc:  # the job goes on; the final pull waits for space
                    ctx.say(f"progress pull skipped: {exc.message}; {exc.hint}")
                next_pull = time.monotonic() + o.pull_every_s
            if not more:  # a full chunk of metrics: read the rest now, not a poll later
                time.sleep(o.poll_s)
        failed = not p.stop_reason and not (st.exit and (st.exit.strip() == "0" or st.exit.startswith("killed:")))
        tail = ""
        if failed:
            self._unless_preempted()  # a job that died on a spot instance: preempted, or a crash?
            # read before PULLED: the watchdog destroys the instance on its next poll after it
            tail = ctx.remote(work.job_log_tail, "job log")
        self.final_pull()
        root, job_id = ctx.run.root, ctx.job_id
        if st.exit and st.exit.startswith("killed:"):
            raise RemoteError(f"the on-instance watchdog stopped the job {at_step(p.last_step)} "
                              f"({st.exit.split(':', 1)[1].strip()})",
                              hint=f"see {root}/job.log; resume with `lorapod run --resume {job_id}`")
        if p.stop_reason:
            return "stopped", f"stopped {at_step(p.last_step)}: {p.stop_reason}"
        if st.exit and st.exit.strip() == "0":
            return "done", f"finished {at_step(p.last_step)}"
        ctx.say("job log (last lines):\n" + tail)
        again = (f"fix, then `lorapod run --resume {job_id}`" if p.last_step is not None else
                 f"nothing was trained, so nothing to resume: fix it and start the job again "
                 f"(`lorapod run SPEC --on {ctx.target}`)")
        raise RemoteError(f"the job failed on the instance (exit {st.exit or 'unknown'}) {at_step(p.last_step)}",
                          hint=f"see {root}/job.log; {again}")

    def _destroyed_elsewhere(self) -> bool:
        """The ledger says this instance is being or was destroyed: only another command does that
        while this controller follows (its own teardown comes after :meth:`follow`)."""
        row = self.ctx.ledger.instance(self.lease.ledger_id)
        return row is not None and row.state in ("destroying", "destroyed")

    def _unless_preempted(self) -> None:
        """On an interruptible instance, ask the provider (for up to ``preempt_confirm_s``: RunPod
        reports the stop after its SIGTERM grace) before calling the job's end a crash; raises
        compute.recovery.Preempted when it was taken back."""
        if self.lease.instance.interruptible:
            from lorapod.compute.recovery import check_preempted

            check_preempted(self.ctx, self.ctx.opts.preempt_confirm_s)

    def stop_in_order(self, why: str) -> None:
        """Interrupted: STOP -> wait (bounded) -> final pull. A second signal skips to destroy."""
        ctx, p, work = self.ctx, self.progress, self.work
        ctx.hard_deadline = deadline_in(ctx.opts.stop_wait_s + ctx.opts.reconnect_s)
        try:
            p.stop_reason = why
            ctx.say("interrupted: asking the job to checkpoint, then pulling and destroying "
                    "(Ctrl-C again to skip the pull)")
            ctx.remote(lambda: work.request_stop(why), "write STOP")
            deadline = deadline_in(ctx.opts.stop_wait_s)
            while time.monotonic() < deadline:
                st = ctx.remote(lambda: work.poll(p.metrics_offset, limit=POLL_BYTES), "poll")
                if not self.take_metrics(st.metrics) and st.done:
                    break
                time.sleep(ctx.opts.poll_s)
            self.final_pull()
        except Interrupted:
            ctx.say("skipping the final pull")
        except LorapodError as exc:
            ctx.say(f"could not pull everything before destroying: {exc.message}")

    def take_metrics(self, data: bytes) -> bool:
        """Use one poll's metrics bytes, bounded and validated (rundir/metrics.py): a
        forged or broken line is dropped and counted, never fatal. True when the poll's chunk was
        full (more is waiting on the instance)."""
        if not data:
            return False
        ctx, p = self.ctx, self.progress
        before = p.feed.dropped_total
        records, full = p.feed.take(data)
        if records:
            row = ctx.ledger.instance(self.lease.ledger_id)
            usd, rate = ctx.ledger.usd(ctx.job_id), (row.usd_per_hour if row is not None else None)
            if self.view is None:
                from lorapod.engine.progress import LineEvery, MetricsView

                self.view, self.lines = MetricsView(usd_cap=ctx.max_usd), LineEvery(tty=ctx.opts.every_step)
        for rec in records:
            now = time.time()
            p.seen_at[int(rec["step"])] = now
            p.instance_first_step.setdefault(self.lease.ledger_id, now)
            if isinstance(rec.get("total_steps"), int):
                p.total_steps = rec["total_steps"]
            if p.first_step_at is None:
                p.first_step_at = time.monotonic()
                ctx.say(f"first training step after {p.first_step_at - ctx.t0:.1f} s")
                ctx.phase("first step", p.first_step_at - self.started.at,
                          "job start to its first step: model download, load, caching")
            p.last_step = rec["step"]
            shown = self.view.feed(rec, usd=usd, usd_per_hour=rate)  # engine/progress.py: one rendering
            if shown and self.lines.show(rec, self.view.total):
                ctx.emit(shown)
        if p.feed.dropped_total > before:
            ctx.say(f"ignored {p.feed.dropped_total - before} metrics line(s) from the instance "
                    f"(so far: {p.feed.describe_dropped()})")
        if records:
            ctx.ledger.job_update(ctx.job_id, last_step=p.last_step)
        return full

    def _check_watchdog(self, st: Any) -> None:
        """The watchdog must live while the job runs (DESIGN invariant 9): checked on every poll,
        started again when it is gone (a host may kill it), said, and recorded for `ps`."""
        ctx, wd, o = self.ctx, self.wd, self.ctx.opts
        now = time.monotonic()
        limit = beat_limit_s(self.watched.watchdog)
        if st.done or st.watchdog is True or now < wd.grace_until:
            wd.unknown_since = None
            return
        if st.watchdog is None:  # no pid file: starting, or removed
            wd.unknown_since = wd.unknown_since or now
            if now - wd.unknown_since < limit:
                return
        event = {"job_id": ctx.job_id, "instance_id": self.lease.ledger_id}
        if wd.restarts >= o.watchdog_restarts:
            if not wd.down_said:
                wd.down_said = True
                ctx.say(f"WARNING: the watchdog on the instance is down and was restarted {wd.restarts} "
                        "time(s) already; nothing on the instance destroys it if this controller dies: keep "
                        f"this process running, or `lorapod down {ctx.job_id}`")
                ctx.ledger.event("watchdog", "down: not restarted again", **event)
            return
        wd.restarts += 1
        ctx.say(f"the watchdog on the instance is not running (killed?); starting it again "
                f"({wd.restarts}/{o.watchdog_restarts})")
        ctx.ledger.event("watchdog", "down: restarting", **event)
        cfg, _ = watchdog_config(ctx, self.lease)  # the caps counted from the instance's creation, as before
        python = self.watched.boot.python
        ctx.remote(lambda: restart_watchdog(self.work, cfg, python), "restart the watchdog")
        wd.unknown_since = None
        wd.grace_until = time.monotonic() + limit
        try:  # the same proof as at the start: a restart the host undoes at once is not "up"
            ctx.remote(lambda: self.work.watchdog_alive(limit), "check the watchdog")
        except WatchdogNotRunning as exc:
            ctx.say(f"the watchdog started again did not stay up ({exc.message})")
            ctx.ledger.event("watchdog", "down: the restart did not take", **event)
            return
        ctx.ledger.event("watchdog", "restarted", **event)

    def _check_budget(self) -> None:
        if self.progress.stop_reason:
            return
        ctx = self.ctx
        left = self._seconds_left()
        if left and min(left) <= ctx.opts.stop_margin_s:
            which = "max-usd" if ctx.max_usd and len(left) and min(left) == left[0] else "max-hours"
            self._request_stop(f"{which} cap is {max(0, min(left)):.0f} s away")

    def _seconds_left(self) -> list[float]:
        """Seconds before the dollar cap, then before the hour cap (each only when set)."""
        ctx = self.ctx
        row = ctx.ledger.instance(self.lease.ledger_id)
        now = time.time()
        left = []
        if ctx.max_usd and row is not None and row.usd_per_hour > 0:
            left.append((ctx.max_usd - ctx.ledger.usd(ctx.job_id, now)) / row.usd_per_hour * 3600)
        if ctx.max_hours:
            hours_used = sum(max(0.0, (r.destroyed_at or now) - r.created_at) for r in ctx.ledger.job_instances(ctx.job_id))
            left.append(ctx.max_hours * 3600 - hours_used)
        return left

    def _request_stop(self, reason: str) -> None:
        p = self.progress
        p.stop_reason = reason
        p.stop_requested_at = time.monotonic()
        self.ctx.say(f"asking the job to checkpoint and stop: {reason}")
        self.ctx.remote(lambda: self.work.request_stop(reason), "write STOP")

    def _pull(self, why: str, newest_only: bool = False) -> None:
        st = self.ctx.remote(lambda: self.pulls.pull(why, newest_only=newest_only), f"pull ({why})")
        self.progress.last_pull_at = time.monotonic()
        if st.files_transferred:
            self.ctx.say(f"pulled {st.files_transferred} files ({why})")

    def final_pull(self) -> None:
        """Pull, then compare sizes and sha256 of every file with the instance's; pull again on a mismatch."""
        ctx, work, p = self.ctx, self.work, self.progress
        py = self.watched.boot.python
        for attempt in range(3):
            self._pull_through_full_disk("final")
            remote = ctx.remote(lambda: work.manifest(py), "checksums")
            local = local_manifest(ctx.run.root)
            bad = [k for k, v in remote.items() if local.get(k) != v and not self.pulls.leaves(k)]
            if not bad:
                fetch_logs(ctx, work)  # before PULLED: the watchdog may remove the folder right after it
                ctx.remote(work.mark_pulled, "mark pulled")
                p.pulled = True
                p.last_pull_at = time.monotonic()
                ctx.say(f"final pull verified: {len(remote)} files, sizes and sha256 match")
                return
            ctx.say(f"final pull: {len(bad)} files differ (e.g. {bad[0]}); pulling again ({attempt + 1}/3)")
            # rsync's quick check (size and whole-second mtime) skips a file rewritten in the same
            # second at the same size (a checkpoint saved twice at one step): the copies that differ
            # go first, so the next pull brings them whatever their times
            root = ctx.run.root.resolve()
            for rel in bad:  # names the instance reported: only files inside the run folder
                local_copy = ctx.run.root / rel
                if (safe_relpath(rel) and local_copy.is_file() and not local_copy.is_symlink()
                        and root in local_copy.resolve().parents):
                    local_copy.unlink()
        raise RemoteError("the pulled files do not match the instance's after 3 tries",
                          hint=f"the instance is being destroyed; check {ctx.run.root}")

    def _pull_through_full_disk(self, why: str) -> None:
        """A pull that finds this machine's disk full: say so and what to free, bring the newest
        checkpoint and the adapter first (the smallest set that resumes), and keep the instance,
        within the caps, for ``disk_full_grace_s`` while retrying; then give up (teardown follows)."""
        try:
            self._pull(why)
            return
        except LocalDiskFull as exc:
            full = exc
        ctx, o, p = self.ctx, self.ctx.opts, self.progress
        p.disk_full = True
        borrowed = ctx.provider.traits.borrowed
        if borrowed:  # the host's watchdog must not remove the only copy meanwhile
            mark_keep(ctx, self.work, True)
        grace = max(0.0, min(o.disk_full_grace_s, min([float("inf"), *self._seconds_left()]) - o.stop_margin_s))
        span = f"{grace / 60:.1f} min" if grace >= 120 else f"{grace:.0f} s"
        ctx.say(f"{full.message}; {full.hint}. lorapod keeps the instance for up to {span} "
                f"(within the caps), retrying every {o.disk_full_retry_s:g} s, the newest checkpoint and the "
                "adapter first")
        deadline = deadline_in(grace)
        newest_home = False
        while True:
            try:
                self._pull(f"{why}: newest checkpoint and adapter", newest_only=True)
                if not newest_home:
                    newest_home = True
                    ctx.say("the newest checkpoint and the adapter are home (enough to resume); the rest waits "
                            "for space")
                self._pull(why)
                p.disk_full = False
                if borrowed:
                    mark_keep(ctx, self.work, False)
                ctx.say("space was freed: everything is pulled")
                return
            except LocalDiskFull as exc:
                full = exc
            if time.monotonic() + o.disk_full_retry_s > deadline:
                raise LocalDiskFull(full.folder, full.needed, full.free)
            time.sleep(o.disk_full_retry_s)
