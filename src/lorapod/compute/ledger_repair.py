"""Rebuilding the ledger from what bills: the providers' instances by label and the run folders.

What no backup holds (:mod:`lorapod.store.ledger_file`) comes back with :func:`rebuild`: the
providers list instances by the label lorapod gave them (``lorapod-<installation>-<instance>-<job>``,
:func:`instance_label`), and every run folder holds its job's id (the folder's name), spec and metrics.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorapod.store.ledger import Ledger
from lorapod.store.ledger_file import (  # noqa: F401  (callers read them from here too)
    KEEP,
    backup,
    backups,
    damage,
    repair_if_damaged,
    set_aside,
)

# ----------------------------------------------------------------------------- check and rebuild



def _execute(sql: str, args: tuple[Any, ...], db: sqlite3.Connection) -> None:
    db.execute(sql, args)

def labelled_instances(say: Callable[[str], None]) -> dict[str, list[Any]]:
    """This installation's instances at each provider that has credentials here, by label."""
    from lorapod.compute import provider as registry
    from lorapod.errors import LorapodError
    from lorapod.store.identity import installation_id, parse_label

    me = installation_id()
    found: dict[str, list[Any]] = {}
    for name in registry.rented_providers():
        try:
            listed = registry.get(name).list_instances()
        except LorapodError as exc:
            say(f"{name}: not listed ({exc.message})")
            continue
        found[name] = [i for i in listed if i.live and (parse_label(i.label) or ("", ""))[0] == me]
    return found


def run_folders(roots: list[Path], local: bool = False) -> list[Path]:
    """Run folders (a spec.yaml in them) directly under each root that ``lorapod run`` made (the
    ledger's), or with ``local`` those `lorapod train` made on this machine, which no ledger holds
    by design. ``lorapod run`` says its first step into the folder's remote-events.log before it
    records the job (compute/session.py, compute/context.py); `lorapod train` never writes one."""
    out = []
    for root in roots:
        if Path(root).is_dir():
            out += sorted(p for p in Path(root).iterdir() if p.is_dir() and (p / "spec.yaml").is_file()
                          and (p / "remote-events.log").is_file() != local)
    return out


def _last_step(run: Path) -> int | None:
    from lorapod.rundir import METRICS, read_records

    records = read_records(run / METRICS, tail_bytes=64 << 10)
    return records[-1]["step"] if records else None


def check(ledger: Ledger, say: Callable[[str], None], roots: list[Path]) -> dict[str, Any]:
    """What the ledger lacks: this installation's live instances the providers list and run
    folders it has no job for. Nothing is changed."""
    from lorapod.store.identity import parse_label

    known = {r.provider_id for r in ledger.instances() if r.provider_id}
    missing_instances = [(name, i) for name, insts in labelled_instances(say).items() for i in insts
                         if i.id not in known]
    jobs = {j.id for j in ledger.jobs()}
    missing_jobs = [p for p in run_folders(roots) if p.name not in jobs]
    for name, inst in missing_instances:
        owner = parse_label(inst.label)
        say(f"{name} instance {inst.id} ({inst.label}) is live and not in the ledger"
            + (f" (ledger id {owner[1]})" if owner else ""))
    for p in missing_jobs:
        say(f"run folder {p} has no job in the ledger")
    local = [p for p in run_folders(roots, local=True) if p.name not in jobs]
    if local:
        say(f"{len(local)} run folder(s) from `lorapod train` on this machine (not ledger jobs, as expected)")
    return {"ledger": str(ledger.path), "damage": None, "jobs": len(jobs), "instances": len(known),
            "missing_instances": len(missing_instances), "missing_jobs": len(missing_jobs),
            "local_runs": len(local), "backups": len(backups(ledger.path))}


def rebuild(ledger: Ledger, say: Callable[[str], None], roots: list[Path]) -> dict[str, int]:
    """Add what :func:`check` finds missing: an instance row per labelled live instance (so
    ``ps`` shows it and ``down`` can destroy it) and a job row per run folder."""
    from lorapod.store.identity import parse_label

    known = {r.provider_id for r in ledger.instances() if r.provider_id}
    jobs = {j.id for j in ledger.jobs()}
    added = {"instances": 0, "jobs": 0}
    now = time.time()
    for name, insts in labelled_instances(say).items():
        for inst in insts:
            if inst.id in known:
                continue
            owner = parse_label(inst.label)
            ledger_id = owner[1] if owner else f"i-{inst.id}"
            job_id = (inst.label or "").split("-", 3)[3] if owner else None
            job_id = None if job_id in (None, "x") else job_id
            args: tuple[Any, ...] = (ledger_id, name, inst.id, job_id, inst.gpu_name, float(inst.usd_per_hour or 0.0),
                                     now, "rebuilt from the provider's listing: billing since before this time")
            ledger._write(functools.partial(_execute, "INSERT OR REPLACE INTO instances (id, provider, provider_id, "
                                            "job_id, state, gpu_name, usd_per_hour, created_at, note) VALUES "
                                            "(?, ?, ?, ?, 'live', ?, ?, ?, ?)", args), "rebuilt instance")
            added["instances"] += 1
            say(f"recorded {name} instance {inst.id} ({inst.label})")
    for run in run_folders(roots):
        if run.name in jobs:
            continue
        step = _last_step(run)
        job_args: tuple[Any, ...] = (run.name, str(run / "spec.yaml"), str(run), "unknown", step,
                                     run.stat().st_mtime, f"rebuilt from the run folder (last step {step})")
        ledger._write(functools.partial(_execute, "INSERT OR IGNORE INTO jobs (id, spec_path, run_dir, provider, "
                                        "state, last_step, started_at, summary) VALUES (?, ?, ?, ?, 'interrupted', "
                                        "?, ?, ?)", job_args), "rebuilt job")
        added["jobs"] += 1
        say(f"recorded job {run.name} from {run}")
    ledger.event("ledger", f"rebuilt: {added['instances']} instance(s), {added['jobs']} job(s) added")
    return added
