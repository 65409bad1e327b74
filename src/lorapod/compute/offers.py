"""Which offers to try, in order. One function, so the planner (issue #3) can take over ranking.

Today: the provider's own offers, filtered by the pinned GPU name, VRAM and the hourly price the
budget allows, cheapest first. A pinned GPU that matches nothing is an error naming what exists.
"""

from __future__ import annotations

from lorapod.compute.provider import Offer, Provider, Requirements, rank_offers
from lorapod.errors import PlanError


def requirements(spec, gpu: str | None = None, max_usd: float | None = None,
                 max_hours: float | None = None) -> Requirements:
    c = spec.compute
    max_rate = None
    usd, hours = max_usd or c.max_usd, max_hours or c.max_hours
    if usd and hours:
        max_rate = usd / hours  # anything pricier cannot run the allowed hours within the budget
    return Requirements(gpu=gpu or c.gpu, max_usd_per_hour=max_rate, disk_gb=c.disk_gb)


def choose_offers(spec, provider: Provider, gpu: str | None = None, max_usd: float | None = None,
                  max_hours: float | None = None) -> list[Offer]:
    req = requirements(spec, gpu, max_usd, max_hours)
    offers = provider.offers(req)
    ranked = rank_offers(offers, req)
    if ranked:
        return ranked
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
