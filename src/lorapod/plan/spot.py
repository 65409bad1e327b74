"""Spot (interruptible) GPUs priced as what they are expected to cost per job, preemptions included.

Why a model and not the hourly rate: a spot hour is 35-65% cheaper (docs/remote.md, Spot), but a
preemption loses the training done since the newest checkpoint that reached home, and the job
then waits for a new instance, sets it up again (boot, install, model download, data upload,
caching, the checkpoint pushed back) and may leave a husk billing storage until it is destroyed
(a stopped RunPod pod keeps its volume; a paused Vast.ai instance keeps its disk). Whether spot is
cheaper *per job* depends on all of that, so the planner quotes the expectation and its range.

The model (hours throughout; every figure it uses comes from the on-demand option of the same GPU
x provider, :func:`spot_job`):

* Preemptions arrive as a Poisson process of ``rate`` per hour spent on a spot instance, setup
  and training alike. Providers publish no rates: the rate is a prior the user can set
  (``compute.preemptions_per_hour``, default :data:`PRIOR_PER_HOUR`), updated by what the ledger
  measured on that provider, GPU and tier (:func:`preemption_rate`).
* Training saves a resume checkpoint every ``interval`` hours of training; writing it stalls
  training ``checkpoint`` hours. It is safe once pulled home, ``pull_lag`` later; to first order a
  preemption therefore loses ``pull_lag`` more, which is counted as part of the setup redone.
* After a preemption: ``wait`` hours to notice it and get the next instance (not billed, not
  exposed), then ``resetup`` hours of setup (billed, exposed), then training resumes from the
  newest checkpoint. A preemption during the setup starts the setup over.
* The husk of a preempted instance bills storage for ``husk`` hours until it is destroyed.
* The review + pull + destroy tail is not exposed: the adapter is home by then.

The expectation is exact for that model. A stretch of ``y`` exposed hours that starts over after
each preemption, each costing ``a`` unexposed hours first, takes ``(1/rate + a)(e^(rate y) - 1)``
hours in expectation and suffers ``e^(rate y) - 1`` preemptions (a geometric number of tries;
Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", 2006, uses
the same renewal argument). The job is the first setup, then one such stretch per checkpoint
interval (``interval + checkpoint``), each preemption in a stretch followed by a recovery (wait +
setup, itself restarted when preempted). ``bench/spot_expected.py`` checks the closed form
against a Monte Carlo of the same process.

The checkpoint interval is Young's, ``sqrt(2 x checkpoint x mean time between preemptions)``
(Young 1974; Daly's higher-order terms change it by well under a percent at these costs), unless
the spec fixes it (``compute.spot_checkpoint_min``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

#: prior preemptions per hour when the user sets none: an assumption, not a published figure
#: (neither RunPod nor Vast.ai publishes rates); one preemption per 10 hours on the instance
PRIOR_PER_HOUR = 0.1
#: the prior counts as one preemption's worth of evidence (an exponential prior on the rate), so a
#: few measured hours move it little and tens of measured hours replace it
PRIOR_EVENTS = 1
#: the quantiles the range of the rate spans
RATE_QUANTILES = (0.1, 0.9)

LOCAL_DISK_MB_S = 400.0  # writing a checkpoint to the instance's disk (assumption)
SAVE_FIXED_S = 2.0  # serialising, fsync, rename, RNG and data position (assumption)
#: noticing a preemption: one poll of the provider's state (dstack notices a lost running spot
#: instance within 2 minutes, issue 2732), then asking for the next instance (assumption: 1 min)
DETECT_MIN = 2.0
ACQUIRE_MIN = 1.0
#: Vast.ai pauses an outbid instance and resumes it if the bid wins again: wait this long for the
#: resume before destroying the husk and moving (assumption), modelled as always moving
VAST_RESUME_WAIT_MIN = 10.0
#: RunPod's spot pod is "stopped" when preempted; lorapod destroys it once noticed
RUNPOD_HUSK_MIN = DETECT_MIN

#: Seconds from a preemption's SIGTERM to its SIGKILL, per provider: RunPod's pricing docs promise
#: "a 5-second warning (SIGTERM signal, followed by SIGKILL)" (runpod/docs pods/pricing.mdx; its
#: 2022 blog says "without notice": then nothing is saved on the signal and the newest checkpoint
#: that reached home is what resumes). Vast.ai documents no signal before it pauses an outbid
#: instance, whose disk it keeps: nothing to fit there.
GRACE_S: dict[str, float] = {"runpod": 5.0}
#: MB/s of the whole save on SIGTERM (engine/checkpoint.py: serialise adapter and optimizer,
#: RNG, sha256 manifest, fsync, rename), from ``bench/spot_save.py`` on the shared 2-vCPU
#: development machine (docs/performance.md, "Save on SIGTERM"): about 510 MB (SDXL rank 16, or a
#: 7B rank-16 all-linear LoRA, with AdamW) took 1.4 s at best (356 MB/s) and 4.4-7 s while other
#: jobs loaded both cores; the save is CPU-bound there (a plain write + fsync of the same bytes
#: took 0.3-1.1 s). 250 MB/s sits below that best, for an instance whose CPUs are its own; an
#: assumption until measured on a rented GPU instance: ``compute.spot_save_mb_s`` replaces it
#: with what the bench measures on yours.
SAVE_MB_S = 250.0
#: the estimate must fit the window this many times over
SAVE_MARGIN = 1.25


@dataclass(frozen=True)
class Rate:
    """Preemptions per hour on a spot instance: the expectation and a likely range, and what it rests on."""

    per_hour: float
    low: float
    high: float
    prior: float
    events: int = 0  # preemptions the ledger measured
    hours: float = 0.0  # hours on spot instances the ledger measured

    @property
    def basis(self) -> str:
        if not self.hours:
            return f"prior {self.prior:g}/h (an assumption: providers publish no rates; compute.preemptions_per_hour)"
        return (f"your ledger: {self.events} preemption(s) in {self.hours:.1f} h on this GPU and tier, "
                f"with the prior {self.prior:g}/h")


def _erlang_cdf(x: float, shape: int, scale_rate: float) -> float:
    """P(X <= x) for a Gamma of integer ``shape`` and rate ``scale_rate`` (an Erlang: closed form)."""
    z = x * scale_rate
    term, total = 1.0, 1.0
    for k in range(1, shape):
        term *= z / k
        total += term
    return 1.0 - math.exp(-z) * total


def _erlang_quantile(p: float, shape: int, scale_rate: float) -> float:
    lo, hi = 0.0, (shape + 10 * math.sqrt(shape) + 10) / scale_rate
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _erlang_cdf(mid, shape, scale_rate) < p else (lo, mid)
    return (lo + hi) / 2


def preemption_rate(prior_per_hour: float | None = None, events: int = 0, hours: float = 0.0) -> Rate:
    """The rate as a Gamma-Poisson update: the prior is a Gamma of shape :data:`PRIOR_EVENTS` and mean
    ``prior_per_hour``; ``events`` preemptions in ``hours`` on spot instances update it to shape
    ``PRIOR_EVENTS + events`` and rate ``PRIOR_EVENTS / prior + hours``. Why: with no measurement the
    range is the prior's (wide: 0.011-0.23/h at the default), and as the ledger grows the
    measured rate ``events / hours`` takes over without a threshold to tune."""
    prior = PRIOR_PER_HOUR if prior_per_hour is None else float(prior_per_hour)
    shape = PRIOR_EVENTS + int(events)
    beta = PRIOR_EVENTS / prior + max(0.0, float(hours))
    lo, hi = (_erlang_quantile(q, shape, beta) for q in RATE_QUANTILES)
    return Rate(shape / beta, lo, hi, prior, int(events), float(hours))


def young_interval(checkpoint_h: float, rate_per_hour: float) -> float:
    """Young's optimum hours of training between checkpoints: ``sqrt(2 x checkpoint x MTBF)``."""
    if rate_per_hour <= 0:
        return math.inf
    return math.sqrt(2 * checkpoint_h / rate_per_hour)


@dataclass(frozen=True)
class SpotJob:
    """What a job on spot does, in hours and dollars per hour (see the module docstring)."""

    setup: float  # the first setup: boot + install, download, upload, cache
    work: float  # training + sampling
    tail: float  # review + pull + destroy (not exposed)
    resetup: float  # the setup after a preemption: the same, the checkpoint pushed back, and the pull lag
    checkpoint: float  # training stalled to write one checkpoint
    wait: float  # notice the preemption and get the next instance (not billed)
    husk: float  # hours a preempted husk bills storage before it is gone
    usd_per_hour: float  # the bid x GPUs
    storage_usd_per_hour: float = 0.0  # the disk while running
    husk_usd_per_hour: float = 0.0  # the disk while stopped or paused
    per_setup_usd: float = 0.0  # paid again with every setup (Vast.ai bandwidth)


@dataclass(frozen=True)
class Outcome:
    """Expected hours (wall clock, including waits), billed hours, dollars and preemptions of one run."""

    hours: float
    billed_hours: float
    usd: float
    preemptions: float
    checkpoints: int
    interval: float  # hours of training between checkpoints

    def to_json(self) -> dict[str, Any]:
        return {"hours": round(self.hours, 4), "billed_hours": round(self.billed_hours, 4), "usd": round(self.usd, 4),
                "preemptions": round(self.preemptions, 3), "checkpoints": self.checkpoints,
                "checkpoint_every_min": round(self.interval * 60, 2) if math.isfinite(self.interval) else None}


def _stretch(y: float, a: float, rate: float) -> tuple[float, float]:
    """Expected hours and preemptions to get ``y`` exposed hours done in one go, each preemption
    costing ``a`` hours first and starting the stretch over."""
    if rate <= 0:
        return y, 0.0
    fails = math.expm1(rate * y)
    return (1 / rate + a) * fails, fails


def segments(work: float, interval: float) -> list[float]:
    """The training split at the checkpoints: full intervals, then what is left."""
    if not math.isfinite(interval) or interval >= work:
        return [work]
    n = int(work // interval)
    rest = work - n * interval
    return [interval] * n + ([rest] if rest > 1e-12 else [])


def expected(job: SpotJob, rate: float, interval: float) -> Outcome:
    """The closed-form expectation of the model in the module docstring, at ``rate`` per hour."""
    hours, fails = _stretch(job.setup, job.wait, rate)
    rec_hours, rec_fails = _stretch(job.resetup, job.wait, rate)
    recovery = job.wait + rec_hours  # one recovery: wait, then the setup until it completes
    segs = segments(job.work, interval)
    for x in segs:
        y = x + job.checkpoint
        if rate <= 0:
            hours += y
            continue
        seg_fails = math.expm1(rate * y)
        hours += (1 / rate + recovery) * seg_fails
        fails += seg_fails * (1 + rec_fails)  # each recovery is preempted rec_fails times on average
    hours += job.tail
    billed = hours - fails * job.wait
    usd = (billed * (job.usd_per_hour + job.storage_usd_per_hour) + fails * job.husk * job.husk_usd_per_hour
           + (1 + fails) * job.per_setup_usd)
    return Outcome(hours, billed, usd, fails, len(segs), interval)


@dataclass(frozen=True)
class SpotQuote:
    """The spot tier of one GPU x provider: its bid, rate, checkpoint interval and outcome with range."""

    tier: str
    bid_per_gpu_hour: float
    rate: Rate
    expected: Outcome
    low: Outcome  # fast end of the speed range, low end of the rate
    high: Outcome  # slow end of the speed range, high end of the rate: the worst end
    price_note: str = ""
    #: seconds from a SIGTERM to a whole checkpoint (one micro-batch, then the save), and the
    #: provider's window between SIGTERM and SIGKILL (None: no signal documented)
    save_s: float = 0.0
    grace_s: float | None = None

    @property
    def save_fits(self) -> bool:
        return self.grace_s is None or self.save_s * SAVE_MARGIN <= self.grace_s

    @property
    def usd_range(self) -> list[float]:
        return [round(self.low.usd, 4), round(self.high.usd, 4)]

    @property
    def hours_range(self) -> list[float]:
        return [round(self.low.hours, 4), round(self.high.hours, 4)]

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "bid_per_gpu_hour": self.bid_per_gpu_hour,
                "preemptions_per_hour": round(self.rate.per_hour, 4),
                "preemptions_per_hour_range": [round(self.rate.low, 4), round(self.rate.high, 4)],
                "rate_basis": self.rate.basis, **self.expected.to_json(),
                "usd_range": self.usd_range, "hours_range": self.hours_range, "price": self.price_note,
                "save_on_sigterm_s": round(self.save_s, 2), "sigterm_grace_s": self.grace_s,
                "save_fits": self.save_fits}


def quote(job: SpotJob, tier: str, bid: float, rate: Rate, train_range: tuple[float, float],
          interval: float | None = None, price_note: str = "") -> SpotQuote:
    """Expected outcome and its range. The interval is Young's at the expected rate (or the spec's)
    and stays fixed across the range, as a run would keep it."""
    tau = interval if interval is not None else young_interval(job.checkpoint, rate.per_hour)
    lo, hi = train_range

    def at(k: float, r: float) -> Outcome:  # the training phases at k x the estimate, the rate r
        return expected(replace(job, work=job.work * k), r, tau)

    return SpotQuote(tier, bid, rate, at(1.0, rate.per_hour), at(lo, rate.low), at(hi, rate.high), price_note)


# -- from the planner's on-demand option to a spot quote, and the choice between the tiers

SETUP_PHASES = ("boot + install", "download base model", "upload data", "cache", "load + tokenize",
                "prep (download + upload + cache)")
WORK_PHASES = ("train", "sampling", "scoring")
STATE_KEY = "LoRA weights, grads, optimizer"
#: what ``lorapod run`` does with the choice (compute/recovery.py)
RUNTIME_NOTE = ("lorapod run rents the tier chosen here (--spot auto|always|never overrides compute.spot) and, "
                "on spot, recovers from each preemption on the next instance from the newest checkpoint, under "
                "the one dollar cap; it falls back to on-demand when spot has no capacity")


def state_mb(job: Any) -> float:
    """MB of a resume checkpoint: the LoRA in fp32 and the optimizer's state (the estimate's LoRA
    term holds weights, gradients and optimizer state; gradients are not saved)."""
    from lorapod.plan.vram import LORA_BYTES, OPTIMIZER_BYTES, GiB

    gib = job.estimate.parts.get(STATE_KEY, 0.0)
    opt = OPTIMIZER_BYTES.get(job.settings.optimizer, 8.0)
    return gib * GiB * (4.0 + opt) / (LORA_BYTES + opt) / 1e6


def save_on_sigterm_s(job: Any, option: Any) -> float:
    """Seconds from a SIGTERM to a whole checkpoint at the estimated speed: the loop finishes the
    micro-batch it is in (engine/loop.py), then saves :func:`state_mb` at
    ``compute.spot_save_mb_s`` or :data:`SAVE_MB_S`. (:data:`SAVE_MARGIN` covers a slower step.)"""
    rate = getattr(job.spec.compute, "spot_save_mb_s", None) or SAVE_MB_S
    speed = getattr(option, "speed", None)
    if speed is not None:  # the planner's seconds per micro-batch on this GPU (plan/speed.py)
        micro = float(speed.seconds_per_step)
    else:  # no speed model: the train phase spread over its micro-batches
        train = sum(p.hours for p in option.phases if p.name == "train") * 3600
        batches = getattr(job, "steps", 0) * max(1, getattr(job.spec.train, "grad_accum", 1))
        micro = train / batches if batches else 0.0
    return micro + state_mb(job) / rate


def save_refusal(q: SpotQuote, where: str) -> str:
    """The one line that says why spot is refused for a save that does not fit."""
    return (f"a checkpoint takes about {q.save_s:.1f} s from SIGTERM (one micro-batch, then the save), which with "
            f"a {SAVE_MARGIN:g}x margin does not fit the {q.grace_s:g} s {where} gives between SIGTERM and SIGKILL")


def spot_job(job: Any, option: Any, bid: float, storage_per_gb_month: float | None) -> SpotJob:
    """The model's inputs from the on-demand ``option`` of the same GPU x provider: its setup,
    work and tail phases, its disk's $/h, its bandwidth; the checkpoint's size from the estimate."""
    from lorapod.catalog.prices import load_storage
    from lorapod.plan.cost import HOME_DOWNLOAD_MB_S, HOURS_PER_MONTH

    hours = {p.name: p.hours for p in option.phases}
    setup = sum(h for n, h in hours.items() if n in SETUP_PHASES)
    work = sum(h for n, h in hours.items() if n in WORK_PHASES)
    tail = sum(h for n, h in hours.items() if n not in SETUP_PHASES and n not in WORK_PHASES)
    total = option.hours_total or 1.0
    running = sum(p.usd for p in option.phases if p.hours == 0 and p.name.startswith("storage")) / total
    bandwidth = sum(p.usd for p in option.phases if p.name == "bandwidth")
    mb = state_mb(job)
    _, st = load_storage()
    checkpoint = (SAVE_FIXED_S + mb / LOCAL_DISK_MB_S) / 3600
    resetup = setup + mb / st["home_upload_mb_s"] / 3600 + mb / HOME_DOWNLOAD_MB_S / 3600
    disk = job.spec.compute.disk_gb
    if option.provider == "vast":
        wait = (DETECT_MIN + VAST_RESUME_WAIT_MIN + ACQUIRE_MIN) / 60
        husk = (DETECT_MIN + VAST_RESUME_WAIT_MIN) / 60
        husk_rate = disk * (storage_per_gb_month or 0.0) / HOURS_PER_MONTH
    else:
        wait, husk = (DETECT_MIN + ACQUIRE_MIN) / 60, RUNPOD_HUSK_MIN / 60
        husk_rate = disk * float(st["runpod"]["container_disk"]["stopped"]) / HOURS_PER_MONTH
    gpus = max(1, job.spec.compute.gpus)
    return SpotJob(setup, work, tail, resetup, checkpoint, wait, husk, bid * gpus, running, husk_rate, bandwidth)


def quote_option(job: Any, option: Any, entry: Any, storage_per_gb_month: float | None) -> SpotQuote:
    """The spot quote of ``option`` at the interruptible price ``entry``: the rate from the prior
    and the ledger, the interval from Young or the spec."""
    from lorapod.store.preemptions import measured_exposure

    c = job.spec.compute
    seen = measured_exposure(option.provider, option.gpu, entry.tier)
    rate = preemption_rate(c.preemptions_per_hour, seen.preemptions if seen else 0, seen.hours if seen else 0.0)
    interval = c.spot_checkpoint_min / 60 if c.spot_checkpoint_min else None
    note = (f"{entry.tier} ${entry.usd_per_hour:.3f}/GPU-h" + (f", as of {entry.as_of}" if entry.as_of else "")
            + (" (live)" if entry.source == "live" else ""))
    q = quote(spot_job(job, option, entry.usd_per_hour, storage_per_gb_month), entry.tier, entry.usd_per_hour,
              rate, option.train_range, interval, note)
    return replace(q, save_s=save_on_sigterm_s(job, option), grace_s=GRACE_S.get(option.provider))


@dataclass(frozen=True)
class TierChoice:
    """Which tier the plan would rent, for which option, and why (``compute.spot``)."""

    policy: str
    tier: str  # "on-demand" | "spot"
    option: int | None  # index into the plan's options
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "tier": self.tier, "option": self.option, "reason": self.reason,
                "runtime": RUNTIME_NOTE}


def decide(options: list[Any], policy: str, max_usd: float | None, max_hours: float | None,
           hour_usd: float = 0.0) -> TierChoice | None:
    """``never``: on-demand. ``always``: the best expected spot quote. ``auto``: spot only when
    its worst end (slow end of the speed range and high end of the preemption rate) still beats
    the best on-demand option at the same slow end, and stays within ``max_usd`` and
    ``max_hours``. Why the same slow end: the speed's uncertainty hits both tiers alike; spot's own
    risk is the rate, so that is the part held at its worst. "Best" and "beats" weigh dollars and
    hours as the plan ranks offers: $ + ``hour_usd`` x hours (plan/choose.py ``rank_key``), so
    a spot quote that saves cents by taking twice as long does not win."""

    def worth(usd: float, hours: float) -> float:
        return usd + hour_usd * hours

    def crosses(o: Any) -> bool:
        return bool((max_usd is not None and o.usd_total > max_usd) or (max_hours is not None and o.hours_total > max_hours))

    fitting = [o for o in options if o.fits]
    if not fitting:
        return None
    # whatever order the options are in (the CLI may sort by time): the plan's own rank
    best = min(fitting, key=lambda o: (crosses(o), worth(o.usd_total, o.hours_total), o.usd_total, o.hours_total))
    priced = sorted((o for o in fitting if o.spot is not None),
                    key=lambda o: (worth(o.spot.expected.usd, o.spot.expected.hours), o.spot.expected.usd))
    # a spot option whose save on SIGTERM cannot fit the provider's window is not taken (item 2)
    spots = [o for o in priced if getattr(o.spot, "save_fits", True)]
    cut = [o for o in priced if o not in spots]

    def where(o: Any) -> str:
        return f"{o.gpu} on {o.provider}"

    if policy == "always" and cut and not spots:
        from lorapod.errors import SpecError

        c = cut[0]
        raise SpecError(f"compute.spot: always: {save_refusal(c.spot, c.provider)} ({where(c)})",
                        hint="set compute.spot: auto (on-demand here) or never; compute.spot_save_mb_s if "
                             "bench/spot_save.py measured a faster save on your instance")

    if policy == "never":
        return TierChoice(policy, "on-demand", options.index(best), "compute.spot is never (the spot quotes show "
                          "what it would cost)")
    if not spots and cut:
        c = cut[0]
        return TierChoice(policy, "on-demand", options.index(best), f"on-demand: spot on {where(c)} would lose "
                          f"work at a preemption: {save_refusal(c.spot, c.provider)}")
    if not spots:
        return TierChoice(policy, "on-demand", options.index(best), f"compute.spot is {policy}, but no GPU that fits "
                          "has an interruptible price within compute.max_bid_per_gpu_hour")
    if policy == "always":
        s = spots[0]  # the best expected quote, dollars and hours weighed as the plan ranks
        over = [f"its worst end ${s.spot.high.usd:.2f} crosses compute.max_usd ${max_usd:g}"] if (
            max_usd is not None and s.spot.high.usd > max_usd) else []
        return TierChoice(policy, "spot", options.index(s), f"compute.spot is always: the best expected spot quote, "
                          f"{where(s)} at ${s.spot.expected.usd:.2f}" + ("; " + over[0] if over else ""))
    od_worst = best.usd_range[1]
    od_slow = getattr(best, "hours_range", (best.hours_total, best.hours_total))[1]
    weighed = f", each hour counted at ${hour_usd:g} (compute.hour_worth_usd)" if hour_usd else ""
    od = (f"on-demand's ${od_worst:.2f} ({where(best)}) in {_hours(od_slow)} at the same slow end of the speed range "
          f"(its expected ${best.usd_total:.2f} in {_hours(best.hours_total)}){weighed}")
    why_not = ""
    for s in spots:
        q = s.spot
        if worth(q.high.usd, q.high.hours) >= worth(od_worst, od_slow):
            why_not = why_not or (f"spot's worst end ({where(s)}, {q.rate.high:.2g} preemptions/h) ${q.high.usd:.2f} "
                                  f"in {_hours(q.high.hours)} does not beat {od}")
            continue
        if max_usd is not None and q.high.usd > max_usd:
            why_not = why_not or f"spot's worst end ${q.high.usd:.2f} ({where(s)}) crosses compute.max_usd ${max_usd:g}"
            continue
        if max_hours is not None and q.high.hours > max_hours:
            why_not = why_not or (f"spot's worst end {q.high.hours:.1f} h ({where(s)}) crosses compute.max_hours "
                                  f"{max_hours:g} h")
            continue
        return TierChoice(policy, "spot", options.index(s),
                          f"spot on {where(s)}: expected ${q.expected.usd:.2f} in {_hours(q.expected.hours)}, at worst "
                          f"${q.high.usd:.2f} in {_hours(q.high.hours)} (slow end of the speed range, "
                          f"{q.rate.high:.2g} preemptions/h), which beats {od}"
                          + (", within the cap" if max_usd else "") + (" and the deadline" if max_hours else ""))
    return TierChoice(policy, "on-demand", options.index(best), "on-demand: " + why_not)


def _hours(h: float) -> str:
    return f"{h * 60:.0f} min" if h < 1.5 else f"{h:.1f} h"
