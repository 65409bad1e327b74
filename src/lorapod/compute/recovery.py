"""Spot runs: tell a preemption from a crash, give the husk back, and resume on the next instance.

A job on an interruptible instance can lose it at any moment (docs/remote.md, Spot). What the
controller sees is only a symptom: SSH stops answering, or the job dies. Which it is, only the
provider can say, so on either symptom the controller asks it (:func:`classify`):

* ``exited`` for an instance rented interruptible is a **preemption** (the provider layer maps
  RunPod's stopped spot pod and Vast.ai's paused, outbid instance to it): :class:`Preempted`;
* ``running`` is a lost connection (reconnect, as always) or, when the job died, a **crash**
  (reported as before, never retried on another instance);
* anything else (gone, error) is not a preemption either.

RunPod warns with SIGTERM 5 s before SIGKILL and reports the stop afterwards, so a job that died
on a spot instance is called a crash only after ``preempt_confirm_s`` with the provider still
saying "running".

After a preemption (:meth:`SpotRun.recover`):

1. **The husk**: where a paused instance resumes by itself (capability ``spot_resume``: Vast.ai),
   it is waited for up to ``spot_resume_wait_s``; then, if the provider keeps bids
   (:class:`~lorapod.compute.provider.SupportsBid`) and the ceiling (``compute.max_bid_per_gpu_hour``
   and the caps' hourly rate) leaves room, its bid is raised once and waited for again. Resumed,
   the job restarts on the same disk. Otherwise (RunPod: a stopped spot pod may restart with zero
   GPUs) the husk is destroyed with confirmation; one that is not confirmed stops the job.
2. **The caps**: every instance of the job bills into the one ledger, so the dollars spent on all
   of them, husks and repeated setups included, count against ``max_usd`` / ``max_hours``; a job
   whose caps are (about to be) reached stops there instead of renting again.
3. **The tier**: spot again, unless :func:`next_tier` says on-demand: too many preemptions, or the
   planner's spot model (plan/spot.py) at the rate this job measured says the rest costs more
   than on-demand or crosses the deadline or the budget that on-demand would meet. A spot
   acquire that finds no capacity falls back to on-demand too.
4. **Exact resume**: the local run folder is the truth. Checkpoints cut off mid-pull (files that
   do not match their ``manifest.json``, or a folder without one beside folders with one) are
   removed, ``metrics.jsonl`` is cut after the newest whole checkpoint (as the engine does on
   resume), and the folder is uploaded to the next instance, which continues from that
   checkpoint (``provision``). The metrics feed follows from the end of the uploaded file.

Every preemption is written to the ledger with what it cost (store/preemptions.py), and every
spot instance's life when it ends: the planner's preemption rates (plan/spot.py) read them back.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.compute.acquire import Lease, acquire, wait_ready
from lorapod.compute.context import JobContext
from lorapod.compute.offers import requirements, spot_ceiling
from lorapod.compute.provider import Instance, SupportsBid, capability
from lorapod.compute.teardown import destroy_claim
from lorapod.errors import LorapodError, PlanError, ProviderError, RemoteError
from lorapod.fsutil import sha256_file
from lorapod.rundir.layout import METRICS, checkpoint_step
from lorapod.store.preemptions import record_preemption, record_spot_instance

if TYPE_CHECKING:
    from lorapod.compute.provider import Provider


class Preempted(RemoteError):
    """The provider took the job's interruptible instance back (stopped / paused / outbid)."""

    def __init__(self, message: str, instance: Instance) -> None:
        super().__init__(message, hint="lorapod resumes the job from its newest checkpoint on another instance")
        self.instance = instance
        self.noticed_at = time.time()


class SpotStop(LorapodError):
    """After a preemption the job cannot go on within its caps: it ends ``stopped``, resumable."""


def classify(provider: Provider, inst: Instance) -> str:
    """What the provider says about ``inst``: ``preempted`` (an interruptible instance that
    exited), ``running``, ``gone``, ``failed`` (exited or in error, not interruptible) or
    ``unknown`` (the provider did not answer: never taken for a preemption)."""
    return _classify(provider, inst)[0]


def _classify(provider: Provider, inst: Instance) -> tuple[str, Instance]:
    try:
        now = provider.refresh(inst)
    except LorapodError:
        return "unknown", inst
    if now.state == "exited" and (now.interruptible or inst.interruptible):
        return "preempted", now.with_(interruptible=True)
    if now.state == "gone":
        return "gone", now
    if now.state in ("exited", "error"):
        return "failed", now
    return ("running" if now.state == "running" else "unknown"), now


def check_preempted(ctx: JobContext, wait_s: float = 0.0, every_s: float = 1.0) -> None:
    """Raise :class:`Preempted` when the provider says the job's interruptible instance was taken
    back, asking for up to ``wait_s`` (a provider reports the stop after the SIGTERM grace).
    Returns when it does not say so: a lost connection or a crash."""
    claim = ctx.claim
    inst = claim.instance if claim is not None else None
    if inst is None or not inst.interruptible:
        return
    deadline = time.monotonic() + wait_s
    while True:
        verdict, now = _classify(ctx.provider, inst)
        if verdict == "preempted":
            raise Preempted(f"the provider took instance {inst.id} back ({now.message or 'stopped'})", now)
        if verdict in ("gone", "failed") or time.monotonic() + every_s > deadline:
            if wait_s > 0:
                ctx.preempt_ruled_out_at = time.monotonic()
            return
        time.sleep(every_s)


# ----------------------------------------------------------------------------- the tier

def next_tier(policy: str, preemptions: int, max_preemptions: int, *, rate: float, rate_high: float,
              remaining_hours: float | None, setup_hours: float, checkpoint_every_hours: float | None,
              spot_usd_per_hour: float, ondemand_usd_per_hour: float | None, usd_left: float | None,
              hours_left: float | None) -> tuple[str, str]:
    """Spot again or on-demand for the rest of the job, and why. The spot side is the planner's
    model (plan/spot.py :func:`~lorapod.plan.spot.expected`) at the rate this job measured: the
    rest of the training, checkpointed as the spec says, each preemption costing the work since
    the last checkpoint and a setup. On-demand when spot's expectation (``rate``) costs no less
    than on-demand, or when its worst end (``rate_high``) crosses the deadline or the budget left
    that on-demand would meet."""
    from lorapod.plan.spot import ACQUIRE_MIN, DETECT_MIN, SpotJob, expected

    if policy == "never":
        return "on-demand", "compute.spot is never"
    if preemptions >= max_preemptions:
        return "on-demand", f"{preemptions} preemptions (at most {max_preemptions} on spot): the rest runs on-demand"
    if remaining_hours is None:
        return "spot", "spot again (the rest of the job cannot be estimated yet)"
    job = SpotJob(setup=setup_hours, work=remaining_hours, tail=0.0, resetup=setup_hours, checkpoint=0.0,
                  wait=(DETECT_MIN + ACQUIRE_MIN) / 60, husk=DETECT_MIN / 60, usd_per_hour=spot_usd_per_hour)
    interval = checkpoint_every_hours or float("inf")
    mean, worst = expected(job, rate, interval), expected(job, rate_high, interval)
    od_hours = setup_hours + remaining_hours
    od_usd = od_hours * ondemand_usd_per_hour if ondemand_usd_per_hour is not None else None
    if od_usd is not None and mean.usd >= od_usd:
        return "on-demand", (f"at {rate:.2g} preemptions/h (this job's) the rest is expected to cost ${mean.usd:.4f} "
                             f"on spot, not less than ${od_usd:.4f} on-demand")
    if hours_left is not None and worst.hours > hours_left >= od_hours:
        return "on-demand", (f"the deadline: spot's worst end {worst.hours * 60:.1f} min for the rest is past the "
                             f"{hours_left * 60:.1f} min left; on-demand needs {od_hours * 60:.1f} min")
    if usd_left is not None and od_usd is not None and worst.usd > usd_left >= od_usd:
        return "on-demand", (f"the budget: spot's worst end ${worst.usd:.4f} for the rest crosses the ${usd_left:.4f} "
                             f"left; on-demand needs ${od_usd:.4f}")
    return "spot", f"spot again: the rest is expected to cost ${mean.usd:.4f}, at worst ${worst.usd:.4f}"


# ----------------------------------------------------------------------------- the run folder

def _whole(folder: Path, with_manifests: bool) -> bool:
    """A checkpoint folder as the engine writes it (engine/checkpoint.py: ``manifest.json``, each
    file's ``bytes`` and ``sha256``, written last; its ``verify`` is this rule, without importing
    torch here) is whole when every file matches; where the trainer writes manifests, a folder
    without one was cut off."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return not with_manifests
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))
        return isinstance(files, dict) and all(
            (folder / name).is_file() and not (folder / name).is_symlink()
            and (folder / name).stat().st_size == int(meta["bytes"]) and sha256_file(folder / name) == meta["sha256"]
            for name, meta in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def settle_run_folder(run_root: Path) -> int | None:
    """Make the local run folder resume exactly: checkpoints cut off mid-pull removed,
    ``metrics.jsonl`` cut after the newest whole checkpoint.
    Returns that checkpoint's step (None: none came home, the job starts over)."""
    ckpts = run_root / "checkpoints"
    folders = [p for p in ckpts.glob("*-*") if p.is_dir() and not p.name.startswith(".")
               and checkpoint_step(p.name) is not None] if ckpts.is_dir() else []
    with_manifests = any((p / "manifest.json").is_file() for p in folders)
    whole: list[int] = []
    for p in folders:
        if _whole(p, with_manifests):
            whole.append(checkpoint_step(p.name) or 0)
        else:  # a copy cut off on its way here: the instance it came from is gone
            shutil.rmtree(p, ignore_errors=True)
    step = max(whole) if whole else None
    metrics = run_root / METRICS
    if metrics.is_file():
        keep = []
        for line in metrics.read_bytes().splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # a line cut off by the pull
            try:
                s = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue
            if step is not None and isinstance(s, int) and s <= step:
                keep.append(line)
        tmp = metrics.with_name(".tmp-metrics.jsonl")
        tmp.write_bytes(b"".join(keep))
        tmp.replace(metrics)
    return step


# ----------------------------------------------------------------------------- the run

@dataclass
class SpotRun:
    """One job's tier across its instances: which it is on, what on-demand would cost, and each
    preemption recovered from (the ledger keeps the dollars: store/preemptions.py)."""

    ctx: JobContext
    progress: Any  # compute.follow.Progress (follow imports this module: no import back)
    policy: str = "never"
    tier: str = "on-demand"
    ondemand_usd_per_hour: float | None = None
    preemptions: int = 0
    bids: dict[str, float] = field(default_factory=dict)  # ledger id -> its bid, once raised

    @property
    def on_spot(self) -> bool:
        return self.tier == "spot"

    def acquire(self) -> Lease:
        """The job's first instance, on the tier the plan chose (``RunOptions.spot``); a spot tier
        with no capacity falls back to on-demand."""
        ctx = self.ctx
        self.policy = ctx.opts.spot_policy
        return self._acquire("spot" if ctx.opts.spot else "on-demand",
                             "the plan's tier choice" if ctx.opts.spot else "")

    def _acquire(self, tier: str, why: str) -> Lease:
        ctx = self.ctx
        if tier == "spot":
            try:
                ctx.say(f"renting on spot (interruptible): {why}")
                lease = acquire(ctx, interruptible=True)
                self.tier = "spot"
                self._ondemand_price(lease)
                ctx.ledger.event("tier", json.dumps({"tier": "spot", "why": why}), job_id=ctx.job_id,
                                 instance_id=lease.ledger_id)
                return lease
            except (ProviderError, PlanError) as exc:
                why = f"spot has no capacity ({exc.message.splitlines()[0]}): falling back to on-demand"
                ctx.say(why)
        self.tier = "on-demand"
        lease = acquire(ctx)
        if why:
            ctx.ledger.event("tier", json.dumps({"tier": "on-demand", "why": why}), job_id=ctx.job_id,
                             instance_id=lease.ledger_id)
        return lease

    def _ondemand_price(self, lease: Lease) -> None:
        """The cheapest on-demand offer of the GPU rented on spot: what the savings compare with."""
        if self.ondemand_usd_per_hour is not None:
            return
        ctx = self.ctx
        try:
            offers = ctx.provider.offers(requirements(ctx.spec, ctx.opts.gpu, ctx.max_usd, ctx.max_hours, job=ctx.job))
        except LorapodError:
            return
        same = [o.usd_per_hour for o in offers if o.gpu_name == lease.offer.gpu_name
                and o.gpu_count == lease.offer.gpu_count and not o.extra.get("interruptible")]
        if same:
            self.ondemand_usd_per_hour = min(same)

    # -------------------------------------------------------------- after a preemption

    def recover(self, lease: Lease, exc: Preempted) -> Lease:
        """The husk given back (or resumed), the caps checked, the next instance acquired, the
        run folder settled for an exact resume. Raises :class:`SpotStop` when the caps say stop."""
        ctx, p = self.ctx, self.progress
        self.preemptions += 1
        inst = exc.instance
        row = ctx.ledger.instance(lease.ledger_id)
        rate = row.usd_per_hour if row is not None else lease.offer.usd_per_hour
        created = row.created_at if row is not None else exc.noticed_at
        ctx.say(f"PREEMPTED: {ctx.provider.name} took instance {inst.id} back at step {p.last_step} "
                f"(preemption {self.preemptions}); recovering")
        resumed = self._resume_in_place(lease, inst)
        husk_end = time.time()
        if resumed is None:
            note = f"preempted ({inst.message or 'stopped by the provider'}): husk destroyed"
            done = destroy_claim(ctx, ctx.claim, note, True, True) if ctx.claim is not None else None
            if done is not None and not done.confirmed:
                raise ProviderError(f"the preempted instance {inst.id} could not be confirmed destroyed",
                                    hint=f"check {ctx.console_link()} and run `lorapod down {ctx.job_id}`")
            ctx.claim = None
            husk_end = time.time()
            self._instance_ended(lease, preempted=True, end=exc.noticed_at)
        resume_step = settle_run_folder(ctx.run.root)
        self._record(lease, exc, rate, created, resume_step, husk_end)
        if resumed is not None:
            ctx.say(f"instance {inst.id} resumed: the job continues there from step {resume_step or 0}")
            return resumed
        self._check_caps(rate)
        tier, why = self._next_tier(lease, rate, resume_step)
        ctx.say(f"next instance: {tier} ({why})")
        if tier == "on-demand" and self.tier == "spot":
            ctx.ledger.event("tier", json.dumps({"tier": "on-demand", "why": why}), job_id=ctx.job_id)
        return self._acquire(tier, why)

    def _resume_in_place(self, lease: Lease, inst: Instance) -> Lease | None:
        """Where the provider resumes a paused instance (Vast.ai): wait, raise the bid within the
        ceiling once, wait again; the lease of the resumed instance, or None."""
        ctx, o = self.ctx, self.ctx.opts
        if not capability(ctx.provider, "spot_resume").supported or ctx.claim is None:
            return None
        ctx.say(f"instance {inst.id} is paused (outbid); waiting up to {o.spot_resume_wait_s:.0f} s for it to resume")
        if self._wait_running(inst, o.spot_resume_wait_s):
            return self._ready_again(lease, inst)
        old, bid = self._raised_bid(lease)
        if bid is None or not isinstance(ctx.provider, SupportsBid):
            return None
        try:
            ctx.provider.change_bid(inst.id, bid)
        except LorapodError as exc:
            ctx.say(f"could not raise the bid of {inst.id}: {exc.message}")
            return None
        self.bids[lease.ledger_id] = bid
        row = ctx.ledger.instance(lease.ledger_id)
        if row is not None:  # the caps count the raised bid (plus the disk, as before) for the instance's life
            ctx.ledger.instance_created(lease.ledger_id, inst.id, row.usd_per_hour + (bid - old))
        ctx.say(f"raised the bid of {inst.id} from ${old:.4f} to ${bid:.4f}/h (within the ceiling); waiting up to "
                f"{o.spot_resume_wait_s:.0f} s again")
        if self._wait_running(inst, o.spot_resume_wait_s):
            return self._ready_again(lease, inst)
        return None

    def _wait_running(self, inst: Instance, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            if classify(self.ctx.provider, inst) == "running":
                return True
            if time.monotonic() + 1.0 > deadline:
                return False
            time.sleep(min(5.0, max(0.2, wait_s / 20)))

    def _ready_again(self, lease: Lease, inst: Instance) -> Lease:
        ctx = self.ctx
        claim = ctx.claim
        assert claim is not None
        if claim.transport is not None:
            with contextlib.suppress(Exception):
                claim.transport.close()
        claim.created_at_mono = time.monotonic()
        new = wait_ready(ctx, claim, ctx.provider.refresh(inst), lease.estimate)
        return Lease(new.ledger_id, new.provider_id, new.instance, lease.offer, new.label, new.identity,
                     new.transport, lease.created_at_mono, lease.estimate)

    def _raised_bid(self, lease: Lease) -> tuple[float, float | None]:
        """One raise: half again the instance's bid (per machine, as the provider takes it), held to
        the ceiling (``compute.max_bid_per_gpu_hour`` and the caps' rate, per GPU); the bid now and
        the raised one, None when there is no room (or no ceiling to stay within)."""
        ctx = self.ctx
        current = self.bids.get(lease.ledger_id) or lease.offer.extra.get("bid") or lease.offer.usd_per_hour
        current = float(current)
        req = requirements(ctx.spec, ctx.opts.gpu, ctx.max_usd, ctx.max_hours, job=ctx.job)
        ceiling = spot_ceiling(ctx.spec, req)
        if ceiling is None:
            return current, None
        bid = round(min(current * 1.5, ceiling * max(1, lease.offer.gpu_count)), 4)
        return current, (bid if bid > current * 1.001 else None)

    def _check_caps(self, rate: float) -> None:
        ctx = self.ctx
        now = time.time()
        margin_h = ctx.opts.stop_margin_s / 3600
        spent = ctx.ledger.usd(ctx.job_id, now)
        if ctx.max_usd is not None and spent + margin_h * rate >= ctx.max_usd:
            raise SpotStop(f"max-usd cap: ${spent:.4f} of ${ctx.max_usd:g} spent when the instance was preempted",
                           hint=f"raise --max-usd, then `lorapod run --resume {ctx.job_id}`")
        if ctx.max_hours is not None:
            used = sum(max(0.0, (r.destroyed_at or now) - r.created_at) for r in ctx.ledger.job_instances(ctx.job_id))
            if used + ctx.opts.stop_margin_s >= ctx.max_hours * 3600:
                raise SpotStop(f"max-hours cap: {used / 3600:.2f} h of {ctx.max_hours:g} h used when the instance "
                               "was preempted", hint=f"raise --max-hours, then `lorapod run --resume {ctx.job_id}`")

    def _next_tier(self, lease: Lease, rate: float, resume_step: int | None) -> tuple[str, str]:
        from lorapod.plan.spot import preemption_rate

        ctx, p = self.ctx, self.progress
        spot_hours = self._spot_hours()
        r = preemption_rate(ctx.spec.compute.preemptions_per_hour, self.preemptions, spot_hours)
        sps = p.seconds_per_step()
        remaining = None
        if sps is not None and p.total_steps:
            remaining = max(0, p.total_steps - (resume_step or 0)) * sps / 3600
        row = ctx.ledger.instance(lease.ledger_id)
        first = self.progress.instance_first_step.get(lease.ledger_id)
        setup_h = ((first - row.created_at) / 3600) if (first and row) else 0.0
        every = ctx.spec.save.every_steps if hasattr(ctx.spec, "save") else None
        interval = (every * sps / 3600) if (every and sps) else None
        now = time.time()
        usd_left = (ctx.max_usd - ctx.ledger.usd(ctx.job_id, now)) if ctx.max_usd is not None else None
        hours_left = None
        if ctx.max_hours is not None:
            used = sum(max(0.0, (x.destroyed_at or now) - x.created_at) for x in ctx.ledger.job_instances(ctx.job_id))
            hours_left = ctx.max_hours - used / 3600
        return next_tier(self.policy, self.preemptions, ctx.opts.max_preemptions, rate=r.per_hour, rate_high=r.high,
                         remaining_hours=remaining, setup_hours=setup_h, checkpoint_every_hours=interval,
                         spot_usd_per_hour=rate, ondemand_usd_per_hour=self.ondemand_usd_per_hour,
                         usd_left=usd_left, hours_left=hours_left)

    def _spot_hours(self) -> float:
        from lorapod.store.preemptions import job_figures

        fig = job_figures(self.ctx.ledger, self.ctx.job_id)
        return fig.spot_hours if fig is not None else 0.0

    def _record(self, lease: Lease, exc: Preempted, rate: float, created: float, resume_step: int | None,
                husk_end: float) -> None:
        """The preemption in the ledger, with the hours it wasted at the instance's rate."""
        ctx, p = self.ctx, self.progress
        first = self.progress.instance_first_step.get(lease.ledger_id)
        at = exc.noticed_at
        if first is None:  # preempted during its setup: all of its life so far was setup
            setup_h, redo_h = (at - created) / 3600, 0.0
        else:
            setup_h = (first - created) / 3600
            kept_at = p.seen_at.get(resume_step or -1)
            since = max(first, kept_at) if kept_at is not None else first
            redo_h = max(0.0, at - since) / 3600
        # the step the job had reached: the last one the metrics poll saw, or the checkpoint that came
        # home if that is later (a pull can land before the poll that reads its step)
        reached = max(s for s in (p.last_step, resume_step) if s is not None) if (
            p.last_step is not None or resume_step is not None) else None
        record_preemption(ctx.ledger, ctx.job_id, instance_id=lease.ledger_id, how=exc.instance.message or "exited",
                          step=reached, resume_step=resume_step, usd_per_hour=rate, redo_hours=redo_h,
                          setup_hours=setup_h, husk_hours=max(0.0, husk_end - at) / 3600,
                          ondemand_usd_per_hour=self.ondemand_usd_per_hour)

    def _instance_ended(self, lease: Lease, *, preempted: bool, end: float | None = None) -> None:
        """A spot instance's life for the planner's rates (store/preemptions.py)."""
        if not lease.offer.extra.get("interruptible"):
            return
        ctx = self.ctx
        row = ctx.ledger.instance(lease.ledger_id)
        if row is None:
            return
        stop = end or row.destroyed_at or time.time()
        gpu = lease.offer.gpu_name
        with contextlib.suppress(LorapodError):
            from lorapod.catalog.gpus import find_gpu

            gpu = find_gpu(gpu).name
        record_spot_instance(ctx.ledger, ctx.job_id, provider=ctx.provider.name, gpu=gpu,
                             tier=str(lease.offer.extra.get("spot_tier") or "spot"),
                             hours=max(0.0, stop - row.created_at) / 3600, preempted=preempted,
                             instance_id=lease.ledger_id, usd_per_hour=row.usd_per_hour,
                             ondemand_usd_per_hour=self.ondemand_usd_per_hour)

    def job_ended(self, lease: Lease | None) -> None:
        """The last instance, once torn down: its life on spot, not preempted."""
        if lease is not None:
            self._instance_ended(lease, preempted=False)


def resume_offset(run_root: Path) -> int:
    """Where the metrics feed follows from after an upload: the end of the settled metrics file."""
    metrics = run_root / METRICS
    return metrics.stat().st_size if metrics.is_file() else 0


def run_tier(spec: Any, provider: Provider, job: Any) -> tuple[bool, str | None]:
    """Whether ``lorapod run`` starts on spot, and the line that says why (None: nothing to say).

    ``never``: on-demand. ``always``: spot, where the provider has a spot tier (else refused
    before anything is rented). ``auto``: the plan's tier choice (plan/spot.py
    :func:`~lorapod.plan.spot.decide`) over this provider's catalog prices: spot only when its
    worst end beats on-demand within the cap and the deadline."""
    from lorapod.errors import SpecError

    policy = spec.compute.spot
    if policy == "never":
        return False, None
    if not capability(provider, "spot").supported:
        why = capability(provider, "spot").reason
        if policy == "always":
            raise SpecError(f"compute.spot: always, but {provider.name} has no spot tier ({why})",
                            hint="use --on runpod or --on vast, or --spot auto|never")
        return False, f"compute.spot: auto: {provider.name} has no spot tier; on-demand"
    from lorapod.plan.choose import plan_job

    always = "compute.spot: always: renting spot (interruptible); each preemption resumes on the next instance"
    if job is None:
        return (True, always) if policy == "always" else (
            False, "compute.spot: auto: the planner cannot price this job; on-demand")
    try:  # always: refused here (SpecError) when no spot GPU's save on SIGTERM fits the provider's window
        choice = plan_job(spec, provider=provider.name, job=job).tier
    except SpecError:
        raise
    except LorapodError as exc:
        return (True, always) if policy == "always" else (
            False, f"compute.spot: auto: the planner cannot price this job ({exc.message}); on-demand")
    if policy == "always":  # the live offers decide; no spot capacity falls back to on-demand
        return True, always + (f" ({choice.reason})" if choice is not None else "")
    if choice is None:
        return False, "compute.spot: auto: the planner cannot price this job; on-demand"
    return choice.tier == "spot", f"compute.spot: auto: {choice.reason}"


def clear_remote_run(ctx: JobContext, work: Any) -> None:
    """Before the job restarts on an instance after a preemption: its run folder and the last
    run's state files go, so the run folder uploaded from here (settled) is the only truth there
    (a resumed instance's disk still holds what was cut off). The environment and data stay."""
    files = " ".join(work.q(n) for n in ("run", "job.pid", "job.exit", "PULLED"))
    ctx.remote(lambda: work.sh(f"rm -rf {files}", timeout=60, check=False), "clear the last run's folder")
