"""Rank every GPU x provider x tier that fits by what the job costs you: dollars and hours.

:func:`plan_job` is the library entry point: ``lorapod plan`` prints its result, ``lorapod
train`` records it in the run folder's plan.json, and remote runs use it to pick an offer.

The ranking (:func:`rank_key`): offers that fit first; then those whose estimate stays within
``compute.max_usd`` and ``compute.max_hours`` (an offer over a cap would be stopped before the
end); then by dollars per job plus ``compute.hour_worth_usd`` (default $1) per hour of the job.
Why weigh hours: dollars alone rank a 22-hour RTX 3090 Wan job first at $2.45, ahead of a 4.8-hour
L40S at $4.85, the card the guide recommends for it; what the user pays for the 3090 is 17 more
hours of waiting (and of exposure to a host that fails or a cap that stops it). Transport
appraisal calls this the generalised cost (fare + value of time x time). The default $1/h is
what the guides' own picks imply: SDXL on an RTX 4090 rather than a 3090 (about $0.19 more to save
0.4 h: >= $0.45/h), Wan on an L40S or H100 rather than the 3090 (>= $0.14/h), while a 30-minute
chat job stays on the cheapest card, where the hours barely differ. Set it to 0 to rank by
dollars alone, higher when your time is dearer; ``--sort usd|time`` re-sorts the table only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from lorapod.catalog.gpus import GPU, find_gpu, load_gpus
from lorapod.catalog.prices import PriceEntry, load_prices, snapshot_providers, tier_descriptions
from lorapod.catalog.snapshot import STALE_AFTER_DAYS, closest
from lorapod.errors import PlanError
from lorapod.plan.cost import Phase, cents, left_running_usd, price_job
from lorapod.plan.estimate import Speed, step_speed
from lorapod.plan.fit import spread
from lorapod.plan.job import Job, build_job
from lorapod.plan.scale import choose_parallel, fsdp_host_ram_gb, multi_gpu, shardable, sharded
from lorapod.plan.speed import family_of
from lorapod.plan.spot import SpotQuote, TierChoice, decide, quote_option
from lorapod.plan.vram import Suggestion, make_fit
from lorapod.spec import JobSpec

LEFT_RUNNING_HOURS = 12
#: how to plan over every GPU and provider when the spec pins compute.gpu / compute.provider
WHOLE_MARKET = "--any-gpu --provider any plans over every GPU and provider"


@dataclass
class Option:
    provider: str
    gpu: str
    tier: str
    usd_per_hour: float
    verdict: str
    headroom_gb: float
    vram_peak_gb: float
    speed: Speed
    phases: list[Phase]
    warnings: list[str] = field(default_factory=list)
    price_source: str = "snapshot"
    # (low, high) multipliers of the training time: the speed estimate's likely range, (1, 1)
    # when the spec fixes the training minutes.
    train_range: tuple[float, float] = (1.0, 1.0)
    vram_range_gb: tuple[float, float] = (0.0, 0.0)
    #: the interruptible tier of this GPU x provider, preemptions included (plan/spot.py); None
    #: when it has no interruptible price, or its bid is above compute.max_bid_per_gpu_hour
    spot: SpotQuote | None = None

    @property
    def fits(self) -> bool:
        return self.verdict != "does-not-fit"

    @property
    def hours_total(self) -> float:
        return sum(p.hours for p in self.phases)

    @property
    def usd_total(self) -> float:
        return sum(p.usd for p in self.phases)

    @property
    def usd_compute(self) -> float:
        """Dollars for GPU time only (the phases with hours), without storage and bandwidth."""
        return sum(p.usd for p in self.phases if p.hours > 0)

    @property
    def train_hours(self) -> float:
        return sum(p.hours for p in self.phases if p.name in ("train", "sampling", "scoring"))

    def _scaled(self, total: float, part: float) -> list[float]:
        lo, hi = self.train_range
        return [round(total - part + part * lo, 4), round(total - part + part * hi, 4)]

    def spot_phases(self) -> list[Phase]:
        """The phases as this option's spot quote prices them: each phase at the bid instead of the
        on-demand rate, then one line for what the spot model adds (checkpoints written, expected
        preemptions: the work lost, the wait and the setup again), so the total is the quote's
        expected hours and dollars. Empty without a spot quote."""
        q = self.spot
        if q is None:
            return []
        ratio = q.bid_per_gpu_hour / self.usd_per_hour if self.usd_per_hour else 0.0
        out = [Phase(p.name, p.hours, p.usd * ratio if p.hours else p.usd) for p in self.phases]
        hours, usd = sum(p.hours for p in out), sum(p.usd for p in out)
        e = q.expected
        out.append(Phase(f"checkpoints + {e.preemptions:.2f} preemptions expected", max(0.0, e.hours - hours),
                         max(0.0, e.usd - usd)))
        return out

    @property
    def hours_range(self) -> list[float]:
        """Likely range of the total hours: the training phases at the speed's likely range."""
        return self._scaled(self.hours_total, self.train_hours)

    @property
    def usd_range(self) -> list[float]:
        train_usd = sum(p.usd for p in self.phases if p.name in ("train", "sampling", "scoring"))
        return self._scaled(self.usd_total, train_usd)

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "gpu": self.gpu,
            "tier": self.tier,
            "usd_per_hour": self.usd_per_hour,
            "fits": self.fits,
            "vram_peak_gb": self.vram_peak_gb,
            "hours_total": round(self.hours_total, 4),
            "usd_total": round(self.usd_total, 4),
            "phases": [{"name": p.name, "hours": round(p.hours, 4), "usd": round(p.usd, 4)} for p in self.phases],
            "warnings": self.warnings,
            "hours_total_range": self.hours_range,
            "usd_total_range": self.usd_range,
            "vram_peak_gb_range": [round(x, 2) for x in self.vram_range_gb],
            "speed": {
                "seconds_per_step": round(self.speed.seconds_per_step, 4),
                "seconds_per_step_range": [round(self.speed.low, 4), round(self.speed.high, 4)],
                "basis": self.speed.basis,
                "runs": [r.job_id for r in self.speed.runs],
            },
            "spot": self.spot.to_json() if self.spot is not None else None,
        }


@dataclass
class Plan:
    job: Job
    options: list[Option]
    snapshot_date: str
    snapshot_note: str
    warnings: list[str] = field(default_factory=list)
    fixes: dict[str, Suggestion | None] = field(default_factory=dict)  # GPU -> change that makes it fit
    #: what narrowed the offers, where it was said -> its value: {"compute.gpu": "RTX 3090",
    #: "compute.provider": "runpod"} from the spec, "--gpu" / "--provider" from the command line
    pinned: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"options": [o.to_json() for o in self.options], "snapshot_date": self.snapshot_date,
                "tier": self.tier.to_json() if self.tier is not None else None, "pinned": self.pinned}

    def to_page(self) -> dict[str, Any]:
        """One plan as a page shows it (the dashboard's Plan page): :meth:`to_json` plus the job with
        its VRAM parts, ``best`` (the index of the first fitting option, 0 when none fits), the
        prices' ``note`` and the ``warnings``."""
        return {**self.to_json(), "job": self.to_record()["job"],
                "best": next((i for i, o in enumerate(self.options) if o.fits), 0),
                "note": self.snapshot_note, "warnings": self.warnings}

    def to_record(self) -> dict[str, Any]:
        """What ``plan.json`` in a run folder holds: the ranking plus the job it was made for."""
        job = self.job
        return {
            **self.to_json(),
            "job": {
                "model": job.model_name,
                "steps": job.steps,
                "optimizer_steps": job.optimizer_steps,
                "images": job.images or None,
                "examples": job.examples or None,
                "tokens": job.tokens or None,
                "vram_peak_gb": job.estimate.peak_gb,
                "vram_parts_gb": job.estimate.parts,
            },
            "warnings": self.warnings,
            "prices": self.snapshot_note,
        }

    @property
    def tier(self) -> TierChoice | None:
        """On-demand or spot, and why (``compute.spot``), over the options as they are now (a
        re-sort or a filter after planning changes the indices); ``best`` stays the best on-demand
        option, :attr:`chosen` what a run rents."""
        c = self.job.spec.compute
        return decide(self.options, c.spot, c.max_usd, c.max_hours, c.hour_worth_usd)

    @property
    def chosen(self) -> tuple[Option, bool] | None:
        """(the option a run would rent, whether on its spot tier): the tier choice's option, else
        :attr:`best`. The plan's headline and phase table describe this one."""
        tier = self.tier
        if tier is not None and tier.option is not None:
            return self.options[tier.option], tier.tier == "spot"
        return (self.best, False) if self.best is not None else None

    @property
    def best(self) -> Option | None:
        return next((o for o in self.options if o.fits), None)


def _dated(as_of: str | None) -> dt.date | None:
    """A price's own date ("2026-10-02", or "2026-03": the first of the month), else None."""
    if not as_of:
        return None
    try:
        return dt.date.fromisoformat(as_of if len(as_of) > 7 else f"{as_of}-01")
    except ValueError:
        return None


def over_cap(o: Option, spec: JobSpec) -> bool:
    """Whether the estimate crosses ``compute.max_usd`` or ``compute.max_hours``: the run would be
    stopped before the end."""
    c = spec.compute
    return bool((c.max_usd is not None and o.usd_total > c.max_usd)
                or (c.max_hours is not None and o.hours_total > c.max_hours))


def rank_key(o: Option, spec: JobSpec) -> tuple[bool, bool, float, float, float]:
    """The plan's order (the module docstring): fits, within the caps, then $ per job +
    ``compute.hour_worth_usd`` x hours; ties by dollars, then hours."""
    return (not o.fits, over_cap(o, spec), o.usd_total + spec.compute.hour_worth_usd * o.hours_total,
            o.usd_total, o.hours_total)


def _check_provider(name: str, priced: set[str] | frozenset[str] = frozenset()) -> str:
    """The provider's key among those with prices (the snapshot's, or ``priced``: the providers of
    the prices given, e.g. a plugin's live offers)."""
    if name in priced:
        return name
    key = name.strip().lower().replace(".ai", "")
    known = snapshot_providers()
    if key in known:
        return key
    near = closest(name, list(known))
    raise PlanError(
        f"unknown provider {name!r}",
        hint=(f"did you mean {', '.join(repr(n) for n in near)}? " if near else "") + f"known: {', '.join(known)}",
    )


def plan_job(
    spec: JobSpec,
    *,
    gpu: str | None = None,
    provider: str | None = None,
    prices: list[PriceEntry] | None = None,
    images: int | None = None,
    examples: int | None = None,
    today: dt.date | None = None,
    trainer: str | None = None,
    job: Job | None = None,
) -> Plan:
    """Estimate the job on every priced GPU and rank the offers that fit by $ per job.

    ``prices`` replaces the snapshot (e.g. live offers from :mod:`lorapod.compute.live_prices`); ``gpu``
    and ``provider`` (or the spec's ``compute.gpu`` / ``compute.provider``) narrow the offers.
    A pinned GPU is shown even when it does not fit, with the change that would make it fit; what
    pinned the offers is in ``Plan.pinned``. ``provider="any"`` (or ``compute.provider: any``)
    is the whole market.
    ``job`` is the job already built for ``spec`` (a run plans it once; ``images`` / ``examples``
    then do not apply). Raises PlanError when nothing fits, naming what would.
    """
    if trainer:  # an external trainer: its setup time and VRAM extras (plan/trainer_profile.py)
        from lorapod.plan.trainer_profile import add_overhead, with_trainer

        spec = with_trainer(spec, trainer)
    job = job if job is not None else build_job(spec, images=images, examples=examples)
    if trainer:
        job = add_overhead(job, trainer)
    snap, snapshot_prices = load_prices()
    entries = list(prices) if prices is not None else list(snapshot_prices)
    pins: dict[str, str] = {}
    if gpu:
        pins["--gpu"] = gpu
    elif spec.compute.gpu:
        gpu = pins["compute.gpu"] = spec.compute.gpu
    pinned = find_gpu(gpu) if gpu else None
    if provider is not None and provider.strip().lower() == "any":
        provider = None
    elif provider is not None:
        pins["--provider"] = provider
    elif spec.compute.provider in snapshot_providers():
        provider = pins["compute.provider"] = spec.compute.provider
    prov = _check_provider(provider, {e.provider for e in prices or ()}) if provider else None
    if pinned:
        entries = [e for e in entries if find_gpu(e.gpu).name == pinned.name]
    if prov:
        entries = [e for e in entries if e.provider == prov]
    interruptible = [e for e in entries if e.interruptible]
    entries = [e for e in entries if not e.interruptible]
    if not entries:
        where = " x ".join(x for x in (pinned.name if pinned else "", prov or "") if x)
        raise PlanError(
            f"no price for {where} in the {snap.date.isoformat()} snapshot",
            hint="run with --live (RUNPOD_API_KEY / VAST_API_KEY) for current offers, or widen it: "
                 + ", ".join(f"{k} {v}" for k, v in pins.items()) + " pinned it; " + WHOLE_MARKET,
        )
    tiers = tier_descriptions()
    stale = snap.is_stale(today)
    plan = Plan(job, [], snap.date.isoformat(), snap.describe(today), list(job.warnings), pinned=pins)
    est = job.estimate
    vram_lo, vram_hi = spread(family_of(job.model), "vram")
    vram_range = (est.peak_gb * vram_lo, est.peak_gb * vram_hi)
    speeds: dict[str, Speed] = {}
    for e in entries:
        g = find_gpu(e.gpu)
        mode, why = choose_parallel(spec.train.parallel, job.estimate, spec.compute.gpus, g.vram_gb,
                                    shardable=shardable(spec, job.model) and not trainer)
        est = sharded(job.estimate, spec.compute.gpus) if mode == "fsdp" else job.estimate  # per-GPU peak
        verdict = est.verdict(g)
        if verdict == "does-not-fit" and not pinned:
            continue
        if g.name not in speeds:
            speeds[g.name] = step_speed(job.model, job.step_settings, g, est, spec_settings=job.settings)
        speed = speeds[g.name]
        speed, e, scale_warns = multi_gpu(speed, e, spec.compute.gpus)
        if mode == "fsdp":
            ram = fsdp_host_ram_gb(job.estimate, spec.compute.gpus) * spec.compute.gpus
            scale_warns += [why, f"host RAM ~{ram:.0f} GB: rank 0 reads the base once and broadcasts it into the shards"]
        phases, warns = price_job(job, e, speed)
        warns = _gpu_warnings(g, verdict, est.headroom_gb(g), speed) + scale_warns + warns
        if verdict == "does-not-fit":
            fix = plan.fixes.setdefault(g.name, make_fit(job.model, job.settings, g.vram_gb, g.arch))
            warns.append(f"needs {est.peak_gb:.1f} GB of {g.vram_gb:g}: " + (f"fits with {fix.describe()}" if fix else "no setting change makes it fit"))
        if e.source == "snapshot":
            desc = tiers.get(e.provider, {}).get(e.tier)
            if e.tier == "cheapest_seen" and desc:
                warns.append(f"{e.tier}: {desc}")
            dated = _dated(e.as_of)
            if dated is not None:  # a figure with its own date and source (prices.yaml)
                days = max(0, ((today or dt.date.today()) - dated).days)
                warns.append(f"price as of {e.as_of}, its own source in prices.yaml ({days} days old)"
                             + (": stale, check --live" if days > STALE_AFTER_DAYS else ""))
            else:
                age = f"price from the {snap.date.isoformat()} snapshot ({snap.age_days(today)} days old)"
                warns.append(age + (": stale, check --live" if stale else ""))
        warns = [*job.warnings, *warns, *_budget_warnings(spec, phases)]
        if speed.basis == "your runs":
            warns.append(f"speed from your {len(speed.runs)} run(s) with these settings: "
                         + ", ".join(r.job_id for r in speed.runs[:3]) + " (lorapod plan --explain)")
        fixed = spec.compute.phases.train_min is not None
        train_range = (1.0, 1.0) if fixed else (speed.low / speed.seconds_per_step, speed.high / speed.seconds_per_step)
        opt = Option(e.provider, g.name, e.tier, e.usd_per_hour, verdict, round(est.headroom_gb(g), 2),
                     est.peak_gb, speed, phases, warns, e.source, train_range, vram_range)
        _add_spot(job, opt, e, interruptible)
        plan.options.append(opt)
    if not plan.options:
        raise _nothing_fits(job, entries)
    plan.options.sort(key=lambda o: rank_key(o, spec))

    best = plan.best
    if best:
        plan.warnings.append(
            f"an instance left running {LEFT_RUNNING_HOURS} h at ${best.usd_per_hour:.2f}/h costs "
            f"${cents(left_running_usd(LEFT_RUNNING_HOURS, best.usd_per_hour))}: lorapod destroys it when the job ends"
        )
    return plan


def _add_spot(job: Job, opt: Option, ondemand: PriceEntry, interruptible: list[PriceEntry]) -> None:
    """The option's spot quote from the lowest interruptible price of its GPU x provider, when the
    bid ceiling allows it (a warning says when it does not)."""
    same = sorted((x for x in interruptible if x.provider == opt.provider and find_gpu(x.gpu).name == opt.gpu),
                  key=lambda x: x.usd_per_hour)
    if not same:
        return
    ceiling = job.spec.compute.max_bid_per_gpu_hour
    ok = [x for x in same if ceiling is None or x.usd_per_hour <= ceiling]
    if not ok:
        opt.warnings.append(f"spot: the lowest bid ${same[0].usd_per_hour:.3f}/GPU-h is above "
                            f"compute.max_bid_per_gpu_hour ${ceiling:g}")
        return
    opt.spot = quote_option(job, opt, ok[0], ondemand.storage_per_gb_month)


def _budget_warnings(spec: JobSpec, phases: list[Phase]) -> list[str]:
    """The spec's caps: the job would be stopped there, so say so before it starts."""
    out = []
    usd, hours = sum(p.usd for p in phases), sum(p.hours for p in phases)
    if spec.compute.max_usd is not None and usd > spec.compute.max_usd:
        out.append(f"over budget: ${usd:.2f} > compute.max_usd ${spec.compute.max_usd:g}")
    if spec.compute.max_hours is not None and hours > spec.compute.max_hours:
        out.append(f"over time: {hours:.1f} h > compute.max_hours {spec.compute.max_hours:g} h")
    return out


def _gpu_warnings(g: GPU, verdict: str, headroom: float, speed: Speed) -> list[str]:
    out = []
    if g.requires:
        out.append(g.requires.get("note") or f"needs PyTorch >= {g.requires.get('torch')} with CUDA {g.requires.get('cuda')}+")
    if verdict == "tight":
        out.append(f"tight: {headroom:.1f} GB of headroom; a longer caption or bucket can OOM")
    if speed.spill:
        out.append(f"spill regime: {speed.seconds_per_step:.0f}+ s/step if the driver spills into system RAM, else OOM")
    return out


class NothingFits(PlanError):
    """The job fits on none of the offered GPUs (the hint says what would make it fit)."""


def _nothing_fits(job: Job, entries: list[PriceEntry]) -> PlanError:
    """Say what would make the job fit: a setting change on the biggest priced card, or a bigger card."""
    _, all_gpus = load_gpus()
    priced = sorted({e.gpu: find_gpu(e.gpu) for e in entries}.values(), key=lambda g: g.vram_gb)
    bigger = [g for g in all_gpus if job.estimate.verdict(g) != "does-not-fit"]
    lines = []
    if priced:
        top = priced[-1]
        fix = make_fit(job.model, job.settings, top.vram_gb, top.arch)
        if fix:
            lines.append(f"on {top.name} ({top.vram_gb:g} GB): {fix.describe()}")
    if bigger:
        lines.append(f"it fits as is on {', '.join(g.name for g in bigger)} (no snapshot price: try --live)")
    if not lines:
        largest = max(all_gpus, key=lambda g: g.vram_gb)
        fix = make_fit(job.model, job.settings, largest.vram_gb, largest.arch)
        lines.append(f"on {largest.name}: {fix.describe()}" if fix else "no single-GPU setting fits: use a smaller model")
    return NothingFits(
        f"{job.model_name} needs about {job.estimate.peak_gb:.1f} GB and fits on none of the priced GPUs",
        hint="; ".join(lines),
    )
