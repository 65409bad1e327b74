"""Which offers to try, in order, and the planner's estimate for each.

The provider's own offers are filtered by the pinned GPU name, VRAM and the hourly price the
budget allows. Then every offer whose GPU the catalog knows is priced by the planner: ranked by its
**dollars per job** on that GPU at that offer's price (a faster card at a higher hourly rate is
often cheaper per job), offers whose GPU the VRAM estimate says cannot fit are dropped, and a job
whose cheapest estimate crosses ``max_usd`` / ``max_hours`` is refused before anything is rented.
Which offers get an estimate is decided by data (a catalog GPU), never by the provider's name: a
plugin or a priced ``ssh://`` host with a known GPU gets one, and with it the default $ cap. When
the planner cannot say (a model outside its catalog, a GPU it does not know), the order is the
cheapest hourly price first. A pinned GPU that matches nothing is an error naming what exists.

The estimate travels as a typed value beside its offer (:class:`RankedOffer`), built from the
job the run planned once (``prepare_run``); the acquire stage puts it on the ``Lease``, where the
default cap (``provision``) and the pull guard (``session``) read it. Nothing planner-made rides
in the provider's free-form ``Offer.extra``: what a provider says about an offer that callers read
(its spot bid and tier, its bandwidth rates, whether its price covers the disk) is a typed field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lorapod.compute.provider import Offer, Provider, Requirements, rank_offers
from lorapod.errors import BudgetError, LorapodError, PlanError

if TYPE_CHECKING:
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfferEstimate:
    """The planner's whole-job figures on one offer: the default $ cap is twice ``usd_total`` /
    ``hours_total`` (provision.py), the pull guard's bound is from ``pull_gb`` (pulls.py)."""

    usd_total: float
    hours_total: float
    pull_gb: float


@dataclass(frozen=True)
class RankedOffer:
    """An offer in the order to try it, with the planner's estimate on it (None: it cannot say)."""

    offer: Offer
    estimate: OfferEstimate | None = None


def planned_job(spec: JobSpec) -> Job | None:
    """The planner's job for ``spec`` (the model resolved, the data counted), or None when it cannot
    plan it (a model outside its catalog, data it cannot read). Built once per run, in
    ``prepare_run``, and handed to every room that needs it."""
    from lorapod.plan.job import build_job

    try:
        return build_job(spec)
    except (LorapodError, OSError, ValueError):
        return None


def requirements(spec: JobSpec, gpu: str | None = None, max_usd: float | None = None,
                 max_hours: float | None = None, *, job: Job | None = None) -> Requirements:
    c = spec.compute
    max_rate = None
    usd, hours = max_usd or c.max_usd, max_hours or c.max_hours
    if usd and hours:
        max_rate = usd / hours  # anything pricier cannot run the allowed hours within the budget
    pinned = gpu or c.gpu
    need = round(float(job.estimate.peak_gb), 1) if job is not None else 0.0
    ram = host_ram_needed_gb(need)
    if job is not None and _fsdp(spec, job):
        # train.parallel fsdp: each GPU holds 1/N of the base, and the host RAM holds one base
        # (rank 0 reads it and broadcasts it into the shards), not one per GPU
        from lorapod.plan.scale import fsdp_host_ram_gb, sharded

        need = round(float(sharded(job.estimate, c.gpus).peak_gb), 1)
        ram = fsdp_host_ram_gb(job.estimate, c.gpus)
    # The planner's peak VRAM, so providers drop cards that cannot hold the job before ranking.
    # A pinned GPU is the user's call (the planner then says what would make it fit).
    return Requirements(gpu=pinned, max_usd_per_hour=max_rate, disk_gb=c.disk_gb,
                        min_vram_gb=0.0 if pinned else need, gpu_count=c.gpus,
                        image=getattr(c, "image", None), host_ram_gb=ram)


def _fsdp(spec: JobSpec, job: Job) -> bool:
    """The engine will shard this job's base (``train.parallel: fsdp`` on several GPUs). Under
    ``auto`` the offers keep the whole-model VRAM floor, so auto picks DDP on every offer kept."""
    from lorapod.plan.scale import shardable

    return spec.train.parallel == "fsdp" and spec.compute.gpus > 1 and shardable(spec, job.model)


def host_ram_needed_gb(vram_gb: float) -> float:
    """Host RAM per GPU: what the GPU will hold passes through host memory first (weights are
    read from disk into RAM before they move to the card; SkyPilot asks RunPod for as much RAM
    per GPU as the GPU has), plus a quarter for the data loader and the trainer's process."""
    return round(vram_gb * 1.25, 1) if vram_gb > 0 else 0.0


def choose_offers(spec: JobSpec, provider: Provider, gpu: str | None = None, max_usd: float | None = None,
                  max_hours: float | None = None, *, job: Job | None, interruptible: bool = False) -> list[RankedOffer]:
    """The offers to try, in order, each with its estimate. ``job`` is the run's planned job
    (:func:`planned_job`; None: the planner cannot estimate it, so cheapest $/h first).
    ``interruptible``: the spot tier's offers, each bid within :func:`spot_ceiling`."""
    req = requirements(spec, gpu, max_usd, max_hours, job=job)
    if interruptible:
        req = replace(req, interruptible=True, max_bid_per_gpu_hour=spot_ceiling(spec, req))
    offers = provider.offers(req)
    ranked = rank_offers(offers, req)
    if ranked:
        if job is None:
            return [RankedOffer(o) for o in ranked]
        return rank_by_job_cost(spec, job, provider.name, ranked, gpu_pinned=bool(req.gpu),
                                max_usd=max_usd or spec.compute.max_usd,
                                max_hours=max_hours or spec.compute.max_hours)
    if req.gpu and offers and not rank_offers(offers, Requirements(gpu=req.gpu)):
        known = sorted({o.gpu_name for o in offers})
        raise PlanError(f"{provider.name} has no offer for GPU '{req.gpu}'",
                        hint=f"pick one of: {', '.join(known[:15])}")
    if req.max_usd_per_hour is not None and offers:
        cheapest = min(o.usd_per_hour for o in offers)
        raise PlanError(f"no {provider.name} offer costs under ${req.max_usd_per_hour:.3f}/h "
                        f"(max_usd / max_hours); the cheapest matching is ${cheapest:.3f}/h",
                        hint="raise --max-usd, lower --max-hours, or pick another --gpu")
    raise PlanError(f"{provider.name} has no offers right now" + (f" for '{req.gpu}'" if req.gpu else ""),
                    hint="try again in a few minutes, or another provider (--on)")


def rank_by_job_cost(spec: JobSpec, job: Job, provider_name: str, offers: list[Offer], *,
                     gpu_pinned: bool = False, max_usd: float | None = None,
                     max_hours: float | None = None) -> list[RankedOffer]:
    """Order ``offers`` as the planner ranks them (plan/choose.py ``rank_key``: within the caps
    first, then $ per job + compute.hour_worth_usd x hours); drop GPUs it says do not fit; refuse a
    job whose best estimate crosses the caps. Offers whose GPU the catalog does not know keep
    $/h order, after the priced ones, without an estimate."""
    if not offers:
        return []
    from lorapod.catalog.gpus import find_gpu
    from lorapod.catalog.prices import PriceEntry
    from lorapod.plan.choose import NothingFits, plan_job, rank_key

    known: dict[str, str] = {}
    for o in offers:
        try:
            known[o.id] = find_gpu(o.gpu_name, o.vram_gb or None).name  # the memory picks a shared name's card
        except LorapodError:
            continue
    # the planner prices one GPU and multiplies by compute.gpus; an offer's price is the whole instance's
    # tier = the offer's id: two offers of one GPU at one $/h may still differ (bandwidth rates)
    entries = [PriceEntry(provider=provider_name, tier=o.id, gpu=known[o.id],
                          usd_per_hour=o.usd_per_hour / max(1, o.gpu_count),
                          source="live", offer_id=o.id,
                          # Vast.ai: bandwidth is billed per GB at the host's rate, apart from
                          # dph_total, which already covers the disk asked for (allocated_storage)
                          download_per_gb=o.download_usd_per_gb, upload_per_gb=o.upload_usd_per_gb,
                          storage_included=o.storage_included)
               for o in offers if o.id in known]
    if not entries:
        return [RankedOffer(o) for o in offers]
    try:
        plan = plan_job(spec, prices=entries, provider=provider_name, job=job)
    except NothingFits as exc:
        raise PlanError(f"none of {provider_name}'s matching offers can hold this job: {exc.message}",
                        hint=exc.hint) from exc
    except PlanError as exc:
        log.info("planner cannot rank this job (%s): cheapest $/h first", exc.message)
        return [RankedOffer(o) for o in offers]
    by_offer = {opt.tier: opt for opt in plan.options}
    capped = spec.model_copy(update={"compute": spec.compute.model_copy(update={"max_usd": max_usd,
                                                                              "max_hours": max_hours})})
    priced: list[tuple[tuple, RankedOffer]] = []
    unpriced: list[RankedOffer] = []
    for o in offers:
        opt = by_offer.get(o.id)
        if opt is None:
            if o.id not in known:
                unpriced.append(RankedOffer(o))  # a GPU the catalog does not know: no estimate either way
            continue  # known GPU the planner left out: its VRAM estimate does not fit
        if not opt.fits and not gpu_pinned:
            continue
        # The estimate travels with the offer: the default cap is twice it (provision.py).
        est = OfferEstimate(round(opt.usd_total, 4), round(opt.hours_total, 4), round(plan.job.pull_gb, 6))
        priced.append((rank_key(opt, capped), RankedOffer(o, est)))
    priced.sort(key=lambda t: (t[0], t[1].offer.usd_per_hour))
    if priced:
        best = by_offer[priced[0][1].offer.id]
        if max_usd is not None and best.usd_total > max_usd:
            raise BudgetError(
                f"the planner estimates ${best.usd_total:.2f} for this job on the cheapest offer "
                f"({best.gpu} at ${best.usd_per_hour:.3f}/h, {best.hours_total:.1f} h), over the ${max_usd:g} cap",
                hint="raise --max-usd, or make the job smaller (fewer steps/epochs); `lorapod plan` shows the phases",
            )
        if max_hours is not None and best.hours_total > max_hours:
            raise BudgetError(
                f"the planner estimates {best.hours_total:.1f} h for this job on the cheapest offer "
                f"({best.gpu}), over the {max_hours:g} h cap",
                hint="raise --max-hours, or pin a faster --gpu; `lorapod plan` compares them",
            )
    return [r for _, r in priced] + unpriced


def spot_requirements(spec: JobSpec, gpu: str | None = None, max_usd: float | None = None,
                      max_hours: float | None = None) -> Requirements:
    """:func:`requirements` for the interruptible tier, as ``compute.spot`` allows it: every bid at
    most ``compute.max_bid_per_gpu_hour`` and at most the hourly rate the dollar cap allows
    (``max_usd / max_hours`` per GPU). ``compute.spot: never`` is refused."""
    from lorapod.errors import SpecError

    c = spec.compute
    if c.spot == "never":
        raise SpecError("compute.spot is never: no spot offers", hint="set compute.spot: auto or always")
    req = requirements(spec, gpu, max_usd, max_hours)
    return replace(req, interruptible=True, max_bid_per_gpu_hour=spot_ceiling(spec, req))


def spot_ceiling(spec: JobSpec, req: Requirements) -> float | None:
    """The highest bid per GPU-hour: ``compute.max_bid_per_gpu_hour`` and the hourly rate the caps
    allow (``max_usd / max_hours`` per GPU), whichever is lower; None: neither is set."""
    c = spec.compute
    ceilings = [x for x in (c.max_bid_per_gpu_hour,
                            req.max_usd_per_hour / max(1, c.gpus) if req.max_usd_per_hour else None) if x]
    return min(ceilings) if ceilings else None
