"""Follow: read the running job until it ends, and bring its results home verified.

Each poll reads a bounded chunk of metrics (validated by :mod:`~lorapod.rundir.metrics`),
checks that the watchdog lives (restarting it a bounded number of times), stops the job before a
cap, and pulls every ``pull_every_s``. When the job is done: the final pull, verified by size and
sha256 against the instance's own list, then PULLED. What the follower has seen is one
:class:`Progress`, which the summary and teardown read.
"""

from __future__ import annotations

import contextlib
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
from lorapod.compute.verdict import Fate, InstanceGone, Judge, ask
from lorapod.compute.wait import deadline_in
from lorapod.errors import LorapodError, RemoteError
from lorapod.rundir import RunDir, at_step
from lorapod.rundir.metrics import POLL_BYTES, MetricsFeed, read_records

#: steps whose first sight a controller keeps (the median step time and a preemption's lost work
#: need only recent ones): a host writing millions of lines costs it no more memory than this
SEEN_STEPS = 4096


def planned_steps(spec: Any, job: Any) -> int | None:
    """The job's length as lorapod knows it before anything runs: the spec's ``train.max_steps``,
    else the planner's optimizer steps (None: neither can say)."""
    if spec.train.max_steps:
        return int(spec.train.max_steps)
    if job is not None:
        return int(job.optimizer_steps or job.steps) or None
    return None


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
    #: the job's length, from the spec (``train.max_steps``) or the planner's count: never a host's
    #: ``total_steps`` (a forged 10**12 once sized the recovery's tier model into a MemoryError)
    total_steps: int | None = None
    #: wall time each step was first seen (a spot run's lost work is measured from it; the newest
    #: :data:`SEEN_STEPS` only, whatever a host sends), and of the first step on each instance
    #: (ledger id: its setup ends there)
    seen_at: dict[int, float] = field(default_factory=dict)
    instance_first_step: dict[str, float] = field(default_factory=dict)

    def saw(self, step: int, at: float) -> None:
        """Step ``step`` seen at ``at`` (again after a resume: the newer time); the oldest forgotten
        past :data:`SEEN_STEPS`."""
        self.seen_at.pop(step, None)
        self.seen_at[step] = at
        while len(self.seen_at) > SEEN_STEPS:
            del self.seen_at[next(iter(self.seen_at))]

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
                 progress: Progress, pulls: PullGuard, judge: Judge) -> None:
        self.ctx, self.lease, self.work, self.watched, self.started = ctx, lease, work, watched, started
        self.progress, self.pulls, self.judge = progress, pulls, judge
        self.view: Any = None  # engine.progress.MetricsView, made when the first metrics arrive (max_usd known)
        self.lines: Any = None  # engine.progress.LineEvery: piped, a line every 30 s as `lorapod train` prints
        self.wd = _WatchdogWatch()

    def follow(self) -> tuple[str, str]:
        """Until the job is done (or stopped): returns (state, message), or raises with what to do.
        An instance found gone (:class:`InstanceGone`: asked, never reconnected to) ends it by what
        came home: a job whose adapter is here finished, whatever destroyed the instance after."""
        try:
            return self._follow()
        except InstanceGone as gone:
            return self._ended_but_gone(gone)

    def _follow(self) -> tuple[str, str]:
        ctx, o, p, work = self.ctx, self.ctx.opts, self.progress, self.work
        next_pull = time.monotonic() + o.pull_every_s
        beat_s = beat_limit_s(self.watched.watchdog)
        while True:
            self._users_word()
            st = ctx.remote(lambda: work.poll(p.metrics_offset, limit=POLL_BYTES, watchdog_beat_s=beat_s), "poll")
            more = self.take_metrics(st.metrics)
            self._check_watchdog(st)
            if st.gone:
                # the work folder vanished: `lorapod down` (or the dashboard's Destroy), the instance's
                # own watchdog, the provider taking it back? Asked, never guessed (compute/verdict.py)
                self._what_happened()
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
            self.judge.check_down()  # the job died because `lorapod down` destroyed its instance
            self.judge.settle(ctx.opts.preempt_confirm_s)  # died on a spot instance: preempted, or a crash?
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

    def _users_word(self) -> None:
        """At every poll: ``lorapod down JOB`` ends the follow (the session brings home what is
        saved and destroys), ``lorapod stop JOB`` is STOP on the instance (once per request)."""
        self.judge.check_down()
        reason = self.judge.take_stop()
        if reason is not None and not self.progress.stop_reason:
            self._request_stop(f"{reason} (`lorapod stop`)")

    def _what_happened(self) -> None:
        """The work folder vanished: the user's ``down``, a preemption, a gone instance, each
        raised as what it is; else the folder was removed on a running instance, which is a
        failure of the job."""
        self.judge.check_down()
        v = self.judge.settle(self.ctx.opts.preempt_confirm_s)
        if v is None:
            v = ask(self.ctx.provider, self.lease.instance)
        if v.fate is Fate.GONE:
            self.judge.gone(v.instance, time.time())
            self.judge.check_down()
            raise InstanceGone(f"instance {self.lease.instance.id} was destroyed while the job ran (its watchdog at a "
                               "cap or a silent controller, or the provider)", v.instance, time.time())
        raise RemoteError("the job's work folder vanished on a running instance (someone removed it)",
                          hint="see `lorapod logs JOB`; resume with `lorapod run --resume JOB`")

    def _adapter_home(self) -> bool:
        """The job's final adapter came home from this instance: written there (its pulled mtime
        is the instance's) since the instance was created, so an older run's adapter never counts."""
        adapter = RunDir(self.ctx.run.root).adapter
        row = self.ctx.ledger.instance(self.lease.ledger_id)
        since = row.created_at if row is not None else 0.0
        try:
            return adapter.is_dir() and not adapter.is_symlink() and any(
                f.is_file() and not f.is_symlink() and f.stat().st_mtime >= since - 5 for f in adapter.iterdir())
        except OSError:
            return False

    def _last_step_home(self) -> int | None:
        """The newest step in the metrics that came home (the one reader; bounded by the job's length)."""
        try:
            records = read_records(RunDir(self.ctx.run.root).metrics_file, tail_bytes=POLL_BYTES,
                                   feed=MetricsFeed(ceiling=self.ctx.spec.train.max_steps))
        except OSError:
            return None
        return max((int(r["step"]) for r in records), default=None)

    def _ended_but_gone(self, gone: InstanceGone) -> tuple[str, str]:
        """The instance was destroyed (its watchdog saw PULLED, a cap or a silent controller; the
        provider) before the controller could see the end or verify the final pull: the job's
        end is what came home. Its adapter here: it finished. A stop it was asked for: stopped,
        the newest checkpoint home. Else it failed, said as such. Never "interrupted", never a
        10-minute reconnect to a machine that is gone."""
        p, root = self.progress, self.ctx.run.root
        home = self._last_step_home()  # the metrics that came home may be newer than the last poll
        if home is not None and (p.last_step is None or home > p.last_step):
            p.last_step = home
        note = (f"; its instance was destroyed before the final pull was verified ({gone.message}); what came home is "
                f"in {root}")
        if self._adapter_home():
            p.pulled = True  # nothing more can come: teardown must not wait for it
            return "done", f"finished {at_step(p.last_step)}{note}"
        if p.stop_reason:
            return "stopped", f"stopped {at_step(p.last_step)}: {p.stop_reason}{note}"
        raise RemoteError(f"the job's instance was destroyed {at_step(p.last_step)} before the job's adapter came home "
                          f"({gone.message})", hint=f"checkpoints that came home are in {root}: "
                          f"`lorapod run --resume {self.ctx.job_id}`")

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
            p.saw(int(rec["step"]), now)
            p.instance_first_step.setdefault(self.lease.ledger_id, now)
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
                with contextlib.suppress(InstanceGone):  # verified just before: its watchdog saw PULLED, destroyed it
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
