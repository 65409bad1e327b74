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
                         hours: float, preempted: bool, instance_id: str | None = None,
                         usd_per_hour: float | None = None, ondemand_usd_per_hour: float | None = None) -> None:
    """One spot instance's life, written when it ends (destroyed after a preemption or at the job's
    end); with its price and the on-demand price of the same GPU, what it saved is known too."""
    rec: dict[str, object] = {"provider": provider, "gpu": gpu, "tier": tier, "hours": round(float(hours), 5),
                              "preempted": bool(preempted)}
    if usd_per_hour is not None:
        rec["usd_per_hour"] = round(float(usd_per_hour), 5)
    if ondemand_usd_per_hour is not None:
        rec["ondemand_usd_per_hour"] = round(float(ondemand_usd_per_hour), 5)
    ledger.event(KIND, json.dumps(rec), job_id=job_id, instance_id=instance_id)


PREEMPTION = "preemption"


def record_preemption(ledger: Ledger, job_id: str, *, instance_id: str, how: str, step: int | None,
                      resume_step: int | None, usd_per_hour: float, redo_hours: float, setup_hours: float,
                      husk_hours: float, ondemand_usd_per_hour: float | None = None) -> None:
    """One preemption of the job's instance and what it cost at the instance's rate: the training
    redone (from the newest checkpoint home to where it was), the setup repeated on the next
    instance, the husk billed until it was gone (the ledger counts a husk at its full rate until
    its destroy is confirmed: never less than the provider's storage-only bill)."""
    cost = (redo_hours + setup_hours + husk_hours) * usd_per_hour
    rec = {"how": how, "step": step, "resume_step": resume_step, "usd_per_hour": round(float(usd_per_hour), 5),
           "redo_hours": round(redo_hours, 6), "setup_hours": round(setup_hours, 6),
           "husk_hours": round(husk_hours, 6), "cost_usd": round(cost, 6)}
    if ondemand_usd_per_hour is not None:
        rec["ondemand_usd_per_hour"] = round(float(ondemand_usd_per_hour), 5)
    ledger.event(PREEMPTION, json.dumps(rec), job_id=job_id, instance_id=instance_id)


@dataclass(frozen=True)
class SpotFigures:
    """One job on spot, from its ledger events: the preemptions, the dollars they cost, and the
    dollars spot saved against running the job on-demand on the same GPU: every spot hour at the
    on-demand price, less the hours the preemptions wasted (an on-demand run would not have spent
    them), less what the job paid for them."""

    preemptions: int
    cost_usd: float
    saved_usd: float | None  # None: no on-demand price was known to compare with
    spot_hours: float

    def line(self) -> str:
        """The summary's, ``ps``'s and ``logs``'s words: a negative saving is a cost, said as one."""
        saved = ""
        if self.saved_usd is not None and self.saved_usd >= 0:
            saved = f", saved ${self.saved_usd:.4f} vs on-demand"
        elif self.saved_usd is not None:
            saved = f", ${-self.saved_usd:.4f} MORE than on-demand would have cost"
        return f"spot: {self.preemptions} preemption(s) costing ${self.cost_usd:.4f}{saved}"

    def to_json(self) -> dict[str, object]:
        return {"preemptions": self.preemptions, "cost_usd": round(self.cost_usd, 6),
                "saved_usd": None if self.saved_usd is None else round(self.saved_usd, 6),
                "spot_hours": round(self.spot_hours, 5)}


def job_figures(ledger: Ledger, job_id: str) -> SpotFigures | None:
    """The job's :class:`SpotFigures`; None when it never ran on spot (``ps``, ``logs``, the
    dashboard and the run's summary all read this one function)."""
    n, cost, hours, gross, priced, seen = 0, 0.0, 0.0, 0.0, False, False
    for e, rec in ledger.records(KIND, PREEMPTION, job_id=job_id):
        seen = True
        if e["kind"] == PREEMPTION:
            n += 1
            cost += float(rec.get("cost_usd") or 0.0)
            od = rec.get("ondemand_usd_per_hour")
            wasted = sum(float(rec.get(k) or 0.0) for k in ("redo_hours", "setup_hours", "husk_hours"))
            # the wasted hours at the on-demand price are not a saving: an on-demand run never had them
            gross -= wasted * float(od) if isinstance(od, int | float) else 0.0
            continue
        h = float(rec.get("hours") or 0.0)
        hours += h
        od, rate = rec.get("ondemand_usd_per_hour"), rec.get("usd_per_hour")
        if isinstance(od, int | float) and isinstance(rate, int | float):
            priced = True
            gross += h * (float(od) - float(rate))
    if not seen:
        return None
    return SpotFigures(n, cost, gross if priced else None, hours)


def exposure(ledger: Ledger, provider: str, gpu: str, tier: str) -> Exposure | None:
    """The ledger's spot instances of ``provider`` x ``gpu`` x ``tier``; None when it has none."""
    n, hours, preempted = 0, 0.0, 0
    for _e, rec in ledger.records(KIND):
        try:
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
