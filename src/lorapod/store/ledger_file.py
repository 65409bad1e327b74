"""The ledger's file kept usable: damage detected, the file set aside, backups (no Ledger import:
:mod:`lorapod.store.ledger` calls this before it opens the file; the rebuild from the providers
is :mod:`lorapod.compute.ledger_repair`).

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
lorapod gave them (``lorapod-<installation>-<instance>-<job>``,
:func:`lorapod.store.identity.instance_label`), and every run folder holds its job's id (the
folder's name), spec and metrics.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any

#: a store.ledger.Ledger (ledger.py imports this module to check its file, so not the reverse)
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
