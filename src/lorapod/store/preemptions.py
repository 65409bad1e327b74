"""Spot instances as measured: how long each ran and whether it ended preempted.

Why: no provider publishes preemption rates (RunPod and Vast.ai alike; dstack's issue 1740 only
says "many RunPod spot offers are unavailable"), so the planner starts from a prior
(:mod:`lorapod.plan.spot`) and needs the rates lorapod itself sees, per provider, GPU and tier.
One ledger event of kind ``spot`` per spot instance when it ends (JSON: provider, gpu, tier,
hours on the instance, preempted) is enough for that: preemptions / exposed hours is the rate.
Like the measured setup phases (:mod:`lorapod.store.phases`), the planner only reads the ledger,
never creates it, and a damaged or locked ledger is no measurement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lorapod.errors import LorapodError
from lorapod.home import lorapod_home
from lorapod.store.ledger import Ledger

KIND = "spot"


@dataclass(frozen=True)
class Exposure:
    """What the ledger saw on one provider x GPU x tier: instances, hours on them, preemptions."""

    instances: int
    hours: float
    preemptions: int


def record_spot_instance(ledger: Ledger, job_id: str | None, *, provider: str, gpu: str, tier: str,
                         hours: float, preempted: bool, instance_id: str | None = None) -> None:
    """One spot instance's life, written when it ends (destroyed after a preemption or at the job's end)."""
    msg = json.dumps({"provider": provider, "gpu": gpu, "tier": tier, "hours": round(float(hours), 5),
                      "preempted": bool(preempted)})
    ledger.event(KIND, msg, job_id=job_id, instance_id=instance_id)


def exposure(ledger: Ledger, provider: str, gpu: str, tier: str) -> Exposure | None:
    """The ledger's spot instances of ``provider`` x ``gpu`` x ``tier``; None when it has none."""
    n, hours, preempted = 0, 0.0, 0
    for e in ledger.events():
        if e["kind"] != KIND:
            continue
        try:
            rec = json.loads(e["message"])
            h = float(rec["hours"])
        except (ValueError, KeyError, TypeError):
            continue
        if (rec.get("provider"), rec.get("gpu"), rec.get("tier")) != (provider, gpu, tier) or not h >= 0:
            continue
        n, hours, preempted = n + 1, hours + h, preempted + bool(rec.get("preempted"))
    return Exposure(n, hours, preempted) if n else None


def measured_exposure(provider: str, gpu: str, tier: str) -> Exposure | None:
    """:func:`exposure` from the user's ledger, read-only; None without a ledger or a measurement."""
    path = lorapod_home() / "ledger.db"
    if not path.is_file():  # plan never creates a ledger
        return None
    try:
        ledger = Ledger.read_only(path)
    except LorapodError:
        return None
    try:
        return exposure(ledger, provider, gpu, tier)
    finally:
        ledger.close()
