"""Keeping the ledger usable: damage detected, the file set aside, backups, and a rebuild.

A ledger file can be truncated (a full disk, a copy cut short), overwritten, or emptied to 0
bytes. SQLite takes a 0-byte file for a new database, which silently forgets every job and
every instance that may still bill, and a malformed one makes every command fail. So before a
ledger is opened for writing, :func:`damage` looks at it (its size, then SQLite's own
``PRAGMA quick_check``, never a raw read of the file); a damaged file is moved aside (``ledger.db.damaged-<time>``, with its
``-wal``/``-shm``), never deleted, and the newest good backup takes its place.

Backups use SQLite's own online backup API (``sqlite3.Connection.backup``: a consistent copy
even while another process writes, https://www.sqlite.org/backup.html), at most one an hour,
the newest :data:`KEEP` kept, in ``backups/`` beside the ledger.

What no backup holds comes back with :func:`rebuild`: the providers list instances by the label
lorapod gave them (``lorapod-<installation>-<instance>-<job>``, :func:`instance_label`), and
every run folder holds its job's id (the folder's name), spec and metrics.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

#: a compute.ledger.Ledger (ledger.py imports this module to check its file, so not the reverse)
Ledger = Any

KEEP = 5
BACKUP_EVERY_S = 3600.0


def damage(path: Path, tries: int = 3) -> str | None:
    """Why the ledger file at ``path`` cannot be trusted, or None (fine, or not there yet).

    A verdict of damage is given only when it holds on ``tries`` looks half a second apart: a
    ledger another process is creating is 0 bytes for a moment, and that must not be taken for
    a truncated one."""
    why = _damage_once(Path(path))
    for attempt in range(1, tries):
        if why is None:
            return None
        time.sleep(0.5 * attempt)
        why = _damage_once(Path(path))
    return why


def _damage_once(path: Path) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return "the file is empty (0 bytes)"
    # Never open() the file ourselves: closing any descriptor of it drops every POSIX lock this
    # process holds on it, the ledger connection's included (https://www.sqlite.org/howtocorrupt.html
    # section 2.2), and a healthy ledger then reads as "malformed". SQLite checks the header itself.
    # A read-write connection where it can be had: it shares the -shm index with the writers, so
    # it reads the WAL's pages too. A mode=ro one may not, and then reads the main file alone
    # mid-checkpoint and calls a healthy ledger "malformed". Read-only only in a read-only folder.
    for uri in (f"file:{path}", f"file:{path}?mode=ro"):
        try:
            con = sqlite3.connect(uri, uri=True, timeout=5.0)
            try:
                result = con.execute("PRAGMA quick_check").fetchone()[0]
            finally:
                con.close()
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "unable to open" in str(exc):
                continue
            return None  # locked: not damage; opening it says what is wrong
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                return "it is not a SQLite database (overwritten?)"
            return f"SQLite says: {exc}"
        return None if result == "ok" else f"SQLite's integrity check says: {str(result)[:200]}"
    return None


@contextmanager
def _repair_lock(folder: Path) -> Iterator[None]:
    """One process repairs at a time (two `lorapod` commands may open a damaged ledger at once)."""
    with open(folder / ".ledger-repair.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def set_aside(path: Path) -> Path:
    """Move a damaged ledger (and its -wal, -shm) to ``<name>.damaged-<time>``; never deletes it."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.replace(src, Path(f"{aside}{suffix}"))
    return aside


def backups(path: Path) -> list[Path]:
    """The ledger's backups, oldest first."""
    return sorted((Path(path).parent / "backups").glob(f"{Path(path).stem}-*.db"))


def backup(ledger: Ledger, force: bool = False) -> Path | None:
    """A consistent copy of ``ledger`` with SQLite's backup API, unless one is younger than
    :data:`BACKUP_EVERY_S` (``force``: now). Keeps the newest :data:`KEEP`. Returns the copy."""
    folder = ledger.path.parent / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    old = backups(ledger.path)
    if old and not force and time.time() - old[-1].stat().st_mtime < BACKUP_EVERY_S:
        return None
    dest = folder / f"{ledger.path.stem}-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}.db"  # sorts by time
    tmp = dest.with_suffix(".tmp")
    target = sqlite3.connect(tmp)
    try:
        ledger._db.backup(target)  # page by page, consistent even while others write
    finally:
        target.close()
    os.replace(tmp, dest)
    with suppress(OSError):
        os.chmod(dest, 0o600)
    for extra in backups(ledger.path)[:-KEEP]:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{extra}{suffix}").unlink(missing_ok=True)
    return dest


def _restore(path: Path) -> Path | None:
    """Copy the newest undamaged backup to ``path`` (with the backup API); its name, or None."""
    for candidate in reversed(backups(path)):
        if damage(candidate) is None:
            src = sqlite3.connect(f"file:{candidate}?mode=ro", uri=True)
            dst = sqlite3.connect(path)
            try:
                src.backup(dst)
            finally:
                src.close()
                dst.close()
            return candidate
    return None


def repair_if_damaged(path: Path) -> str | None:
    """Before opening ``path`` for writing: set a damaged ledger aside and restore the newest good
    backup. Returns what was done (for the user), or None when the ledger is fine."""
    path = Path(path)
    if damage(path, tries=1) is None:
        return None
    with _repair_lock(path.parent):
        why = damage(path)  # looked at again, and another process may have repaired it meanwhile
        if why is None:
            return None
        aside = set_aside(path)
        restored = _restore(path)
    return (f"the ledger {path} was damaged ({why}); it was set aside as {aside.name} and "
            + (f"the backup {restored.name} restored" if restored else "a new ledger started")
            + "; `lorapod ledger rebuild` recovers instances from the providers and jobs from the run folders")


# ----------------------------------------------------------------------------- check and rebuild


def labelled_instances(say: Callable[[str], None]) -> dict[str, list[Any]]:
    """This installation's instances at each provider that has credentials here, by label."""
    from lorapod.compute import provider as registry
    from lorapod.compute.ledger import installation_id, parse_label
    from lorapod.errors import LorapodError

    me = installation_id()
    found: dict[str, list[Any]] = {}
    for name in ("runpod", "vast"):
        try:
            listed = registry.get(name).list_instances()
        except LorapodError as exc:
            say(f"{name}: not listed ({exc.message})")
            continue
        found[name] = [i for i in listed if i.live and (parse_label(i.label) or ("", ""))[0] == me]
    return found


def run_folders(roots: list[Path]) -> list[Path]:
    """Run folders (a spec.yaml in them) directly under each root."""
    out = []
    for root in roots:
        if Path(root).is_dir():
            out += sorted(p for p in Path(root).iterdir() if p.is_dir() and (p / "spec.yaml").is_file())
    return out


def _last_step(run: Path) -> int | None:
    from lorapod.compute.metrics_feed import MAX_STEP

    metrics = run / "metrics.jsonl"
    try:
        with open(metrics, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, end - (64 << 10)))
            tail = fh.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
            return step
    return None


def check(ledger: Ledger, say: Callable[[str], None], roots: list[Path]) -> dict[str, Any]:
    """What the ledger lacks: this installation's live instances the providers list and run
    folders it has no job for. Nothing is changed."""
    from lorapod.compute.ledger import parse_label

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
    return {"ledger": str(ledger.path), "damage": None, "jobs": len(jobs), "instances": len(known),
            "missing_instances": len(missing_instances), "missing_jobs": len(missing_jobs),
            "backups": len(backups(ledger.path))}


def rebuild(ledger: Ledger, say: Callable[[str], None], roots: list[Path]) -> dict[str, int]:
    """Add what :func:`check` finds missing: an instance row per labelled live instance (so
    ``ps`` shows it and ``down`` can destroy it) and a job row per run folder."""
    from lorapod.compute.ledger import parse_label

    known = {r.provider_id for r in ledger.instances() if r.provider_id}
    jobs = {j.id for j in ledger.jobs()}
    added = {"instances": 0, "jobs": 0}
    now = time.time()
    for name, insts in labelled_instances(say).items():
        for inst in insts:
            if inst.id in known:
                continue
            owner = parse_label(inst.label)
            iid = owner[1] if owner else f"i-{inst.id}"
            job_id = (inst.label or "").split("-", 3)[3] if owner else None
            job_id = None if job_id in (None, "x") else job_id
            args = (iid, name, inst.id, job_id, inst.gpu_name, float(inst.usd_per_hour or 0.0), now,
                    "rebuilt from the provider's listing: billing since before this time")
            ledger._write(lambda db, a=args: db.execute(
                "INSERT OR REPLACE INTO instances (id, provider, provider_id, job_id, state, gpu_name, usd_per_hour,"
                " created_at, note) VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?)", a), "rebuilt instance")
            added["instances"] += 1
            say(f"recorded {name} instance {inst.id} ({inst.label})")
    for run in run_folders(roots):
        if run.name in jobs:
            continue
        step = _last_step(run)
        args = (run.name, str(run / "spec.yaml"), str(run), "unknown", step, run.stat().st_mtime,
                f"rebuilt from the run folder (last step {step})")
        ledger._write(lambda db, a=args: db.execute(
            "INSERT OR IGNORE INTO jobs (id, spec_path, run_dir, provider, state, last_step, started_at, summary)"
            " VALUES (?, ?, ?, ?, 'interrupted', ?, ?, ?)", a), "rebuilt job")
        added["jobs"] += 1
        say(f"recorded job {run.name} from {run}")
    ledger.event("ledger", f"rebuilt: {added['instances']} instance(s), {added['jobs']} job(s) added")
    return added
