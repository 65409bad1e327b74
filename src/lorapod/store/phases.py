"""Setup phases of remote jobs (boot, SSH ready, environment, data sync, first step), as measured.

The session writes one ledger event of kind ``phase`` per step (JSON: phase, seconds, note,
provider). ``lorapod ps`` shows them; the planner's "boot + install" uses their median per
provider once the ledger has some, instead of its default guess: cold-start time is money.
"""

from __future__ import annotations

import statistics
from typing import Any

from lorapod.errors import LorapodError
from lorapod.home import lorapod_home
from lorapod.store.ledger import Ledger

ORDER = ("boot", "ssh ready", "environment", "data sync", "first step")
#: What the planner's "boot + install" phase covers (the first step is in its own phases).
BOOT_INSTALL = ("boot", "ssh ready", "environment")


def phase_events(ledger: Ledger, job_id: str | None = None) -> list[dict[str, Any]]:
    return [{**rec, "job_id": e["job_id"]} for e, rec in ledger.records("phase", job_id=job_id)]


def job_phases(ledger: Ledger, job_id: str) -> dict[str, float]:
    """Seconds per phase for a job (its latest instance's, when it was resumed)."""
    out: dict[str, float] = {}
    for rec in phase_events(ledger, job_id):
        out[rec["phase"]] = float(rec["s"])
    return {k: out[k] for k in sorted(out, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))}


def describe(phases: dict[str, float]) -> str:
    return " · ".join(f"{name} {s:.0f}s" for name, s in phases.items())


def measured_boot_min(provider: str) -> tuple[float, int] | None:
    """Median minutes of boot + SSH + environment over this provider's jobs in the ledger, and
    how many jobs that is; None without a ledger or a complete measurement."""
    path = lorapod_home() / "ledger.db"
    if not path.is_file():  # plan never creates a ledger
        return None
    try:
        ledger = Ledger.read_only(path)  # plan only reads: a damaged or locked ledger is no estimate
    except LorapodError:
        return None
    try:
        per_job: dict[str, dict[str, float]] = {}
        for rec in phase_events(ledger):
            if rec.get("provider") == provider and rec["phase"] in BOOT_INSTALL:
                per_job.setdefault(rec["job_id"], {})[rec["phase"]] = float(rec["s"])
    finally:
        ledger.close()
    totals = [sum(p.values()) / 60 for p in per_job.values() if all(k in p for k in BOOT_INSTALL)]
    if not totals:
        return None
    return statistics.median(totals), len(totals)
