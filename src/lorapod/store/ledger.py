"""The ledger: what lorapod rented, for which job, at what price, and whether it is gone.

SQLite in ``$LORAPOD_HOME/ledger.db`` (default ``~/.lorapod``), WAL mode so ``lorapod ps`` reads
while a run writes. Two invariants make teardown trustworthy:

1. an instance row exists **before** the provider's create call returns to any caller code
   (:meth:`Ledger.instance_creating` is written first, then :meth:`Ledger.instance_created`
   fills in the provider's id), so a crash between the two still leaves a row to sweep;
2. an instance is marked ``destroyed`` only after the provider confirmed it is gone.

Ownership (the installation id in every instance's label, the controller that follows a job)
is :mod:`lorapod.store.identity`'s.

Dollars are the instance's own price times the time from create to confirmed destroy (or now,
while it lives). Nothing secret is ever written here.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lorapod.errors import LorapodError
from lorapod.home import lorapod_home
from lorapod.store.identity import controller_alive, controller_id

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
  id TEXT PRIMARY KEY,            -- lorapod's own id, known before the provider answers
  provider TEXT NOT NULL,
  provider_id TEXT,               -- the provider's id, once create() returned
  job_id TEXT,
  state TEXT NOT NULL,            -- creating | live | destroying | destroyed | failed
  gpu_name TEXT,
  usd_per_hour REAL NOT NULL DEFAULT 0,
  ssh_host TEXT, ssh_port INTEGER, ssh_user TEXT,
  offer_json TEXT,
  access_json TEXT,               -- how to reach it again (key path, work folder): never a secret
  created_at REAL NOT NULL,
  ready_at REAL,
  destroy_requested_at REAL,
  destroyed_at REAL,
  note TEXT
);
CREATE INDEX IF NOT EXISTS instances_state ON instances(state);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  spec_path TEXT,
  run_dir TEXT NOT NULL,
  provider TEXT NOT NULL,
  target TEXT,                    -- what --on said (ssh://..., runpod, vast)
  instance_id TEXT,
  state TEXT NOT NULL,            -- starting | running | stopping | done | stopped | failed | interrupted
  remote_dir TEXT,
  last_step INTEGER,
  max_usd REAL, max_hours REAL,
  controller TEXT,                -- host:pid of the `lorapod run` process following it
  started_at REAL NOT NULL,
  ended_at REAL,
  summary TEXT
);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  ts REAL NOT NULL,
  job_id TEXT,
  instance_id TEXT,
  kind TEXT NOT NULL,
  message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS measured_runs (
  job_id TEXT PRIMARY KEY,        -- what the planner learned from a finished job (plan/learned.py)
  recorded_at REAL NOT NULL,
  gpu_name TEXT,
  model TEXT,
  settings_json TEXT,             -- the planner's Settings of the job
  seconds_per_step REAL,          -- median seconds per micro-batch
  peak_gb REAL,                   -- highest mem_gb the run logged
  steps INTEGER
);
CREATE TABLE IF NOT EXISTS prices (
  provider TEXT NOT NULL,
  offer_id TEXT NOT NULL,
  gpu_name TEXT,
  usd_per_hour REAL NOT NULL,
  seen_at REAL NOT NULL,
  PRIMARY KEY (provider, offer_id, seen_at)
);
CREATE INDEX IF NOT EXISTS events_job_kind ON events(job_id, kind);
"""

LIVE = ("creating", "live", "destroying")
TABLES = ("instances", "jobs", "events", "measured_runs", "prices")


@dataclass(frozen=True)
class InstanceRow:
    id: str
    provider: str
    provider_id: str | None
    job_id: str | None
    state: str
    gpu_name: str | None
    usd_per_hour: float
    ssh_host: str | None
    ssh_port: int | None
    ssh_user: str | None
    created_at: float
    ready_at: float | None
    destroy_requested_at: float | None
    destroyed_at: float | None
    note: str | None

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def usd(self, now: float | None = None) -> float:
        end = self.destroyed_at or (now if now is not None else time.time())
        return max(0.0, end - self.created_at) / 3600.0 * self.usd_per_hour


@dataclass(frozen=True)
class JobRow:
    id: str
    spec_path: str | None
    run_dir: str
    provider: str
    target: str | None
    instance_id: str | None
    state: str
    remote_dir: str | None
    last_step: int | None
    max_usd: float | None
    max_hours: float | None
    controller: str | None
    started_at: float
    ended_at: float | None
    summary: str | None


BUSY_TIMEOUT_S = 30.0
T = TypeVar("T")
Write = Callable[[sqlite3.Connection], None]


def _transient(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _local_fault(exc: sqlite3.OperationalError) -> bool:
    """This machine's side failing the write (a full disk, a read-only home, an I/O error): like a
    lock, it must never end a run (DESIGN invariant 8); the write is queued and said."""
    text = str(exc)
    return _transient(exc) or any(s in text for s in ("readonly", "read-only", "disk is full", "disk I/O error",
                                                       "unable to open"))


def retry_busy(fn: Callable[[], T], deadline_s: float = BUSY_TIMEOUT_S, pause_s: float = 0.05) -> T:
    """Run ``fn`` again while SQLite says the database is locked or busy, until ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not _transient(exc) or time.monotonic() >= end:
                raise
            time.sleep(pause_s)


def busy_timeout_s() -> float:
    """How long one ledger write waits for a lock another process holds: ``LORAPOD_LEDGER_BUSY_S``
    or :data:`BUSY_TIMEOUT_S`."""
    try:
        return max(0.01, float(os.environ.get("LORAPOD_LEDGER_BUSY_S") or BUSY_TIMEOUT_S))
    except ValueError:
        return BUSY_TIMEOUT_S


class LedgerBusy(LorapodError):
    """Another process held the ledger's write lock longer than lorapod waits."""


class LedgerUnusable(LorapodError):
    """The ledger cannot be opened for writing here (a read-only or missing home, a full disk)."""


class LedgerDamaged(LorapodError):
    """The ledger file is damaged; read-only commands cannot use it (writing ones repair it)."""


class Ledger:
    """One connection per process; every write is its own short transaction.

    The ledger never ends a run (DESIGN invariant 8): a write that finds the database locked by
    another process (a backup, the ``sqlite3`` shell) waits ``busy_timeout_s()``, and if the lock
    is still held it is *queued*, in order, and retried before every later write and at
    :meth:`flush`, while the run goes on. Only the write that must precede a provider's create
    (:meth:`instance_creating`, invariant 1) is never queued: it raises :class:`LedgerBusy`, a
    :class:`LorapodError` that says what to do, before anything is rented.

    A ledger file that is damaged (a 0-byte file included) is set aside with its backup and
    replaced by the newest good backup when opened (:mod:`lorapod.compute.ledger_repair`);
    :attr:`notice` then says what happened.
    """

    def __init__(self, path: str | Path | None = None, repair: bool = True) -> None:
        self.path = Path(path) if path else lorapod_home() / "ledger.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.busy_s = busy_timeout_s()
        self.notice: str | None = None
        self._pending: list[tuple[Write, str]] = []
        self._lock = threading.RLock()
        if repair:
            from lorapod.store.ledger_file import repair_if_damaged

            try:
                self.notice = repair_if_damaged(self.path)
            except OSError as exc:  # e.g. a read-only home: the damaged file cannot be set aside
                raise LedgerDamaged(f"the ledger {self.path} is damaged and cannot be set aside ({exc.strerror})",
                                    hint="make LORAPOD_HOME writable and run `lorapod ledger rebuild`; `lorapod ps` "
                                         "and `lorapod down JOB` work meanwhile from the providers' listings") from exc
        try:
            self._db = sqlite3.connect(self.path, timeout=self.busy_s, isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
        except sqlite3.OperationalError as exc:
            raise LedgerUnusable(f"cannot open the ledger {self.path} ({exc})",
                                 hint="check that LORAPOD_HOME exists and is writable; `lorapod ps` reads it "
                                      "read-only") from exc
        try:
            retry_busy(self._prepare, self.busy_s)
        except sqlite3.OperationalError as exc:
            self._db.close()
            if _transient(exc):
                raise LedgerBusy(f"the ledger {self.path} stayed locked by another process for {self.busy_s:.0f} s",
                                 hint="close the program holding it (a `sqlite3` shell, a backup), then run "
                                      "again; `lorapod ps` still reads it") from exc
            raise LedgerUnusable(f"cannot prepare the ledger {self.path} ({exc})",
                                 hint="check that LORAPOD_HOME is writable and its disk not full; `lorapod ps` "
                                      "reads it read-only") from exc
        with suppress(OSError):
            os.chmod(self.path, 0o600)
        if self.notice:
            self.event("ledger", self.notice)

    @classmethod
    def read_only(cls, path: str | Path | None = None) -> Ledger:
        """The ledger opened for reading only (``lorapod ps``): nothing is created, changed or
        locked for writing, so it works in a read-only ``LORAPOD_HOME`` and beside a run that
        writes. A missing file reads as an empty ledger; a damaged one raises :class:`LedgerDamaged`."""
        from lorapod.store.ledger_file import damage

        self = cls.__new__(cls)
        home = Path(os.environ.get("LORAPOD_HOME") or Path.home() / ".lorapod").expanduser()
        self.path = Path(path) if path else home / "ledger.db"
        self.busy_s, self.notice, self._pending, self._lock = busy_timeout_s(), None, [], threading.RLock()
        self._read_only = True
        why = damage(self.path)
        if why is not None:
            raise LedgerDamaged(f"the ledger {self.path} is damaged: {why}",
                                hint="`lorapod ledger rebuild` sets it aside, restores the newest backup and "
                                     "recovers instances from the providers; `lorapod down JOB` works meanwhile")
        if not self.path.is_file():
            self._db = sqlite3.connect(":memory:", check_same_thread=False)
            self._db.executescript(SCHEMA)
        else:
            # mode=ro still needs the -shm file of a WAL ledger (or a folder where it can be made);
            # immutable=1 reads a read-only folder's ledger as it is, without locks.
            for query in ("mode=ro", "mode=ro&immutable=1"):
                self._db = sqlite3.connect(f"file:{self.path}?{query}", uri=True, timeout=self.busy_s,
                                           isolation_level=None, check_same_thread=False)
                try:
                    self._db.execute("SELECT count(*) FROM jobs").fetchone()
                    break
                except sqlite3.OperationalError as exc:
                    self._db.close()
                    if query != "mode=ro":
                        raise LorapodError(f"cannot read the ledger {self.path}: {exc}",
                                           hint="check LORAPOD_HOME and its permissions") from exc
        self._db.row_factory = sqlite3.Row
        return self

    _read_only = False

    def _prepare(self) -> None:
        """WAL mode (kept by the file once set) and the tables. Two processes opening a new ledger
        at once can deadlock switching it to WAL; SQLite then answers "database is locked" at
        once, without waiting, so the caller retries."""
        if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        have = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not set(TABLES) <= have:
            self._db.executescript(SCHEMA)  # a read needs no write lock: a held lock only blocks a new file

    def close(self) -> None:
        if not self._read_only:
            self.flush(wait_s=min(self.busy_s, 5.0))
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _apply(self, fn: Write) -> None:
        with self._tx() as db:
            fn(db)

    @property
    def pending(self) -> int:
        """Writes waiting for a lock another process holds."""
        return len(self._pending)

    def flush(self, wait_s: float = 0.0) -> bool:
        """Apply the queued writes, in order, waiting at most ``wait_s`` for the lock; True when
        none is left."""
        with self._lock:
            if not self._pending:
                return True
            end = time.monotonic() + wait_s
            self._db.execute(f"PRAGMA busy_timeout={int(max(0.0, min(wait_s, 0.2)) * 1000)}")
            try:
                while self._pending:
                    fn, _ = self._pending[0]
                    try:
                        self._apply(fn)
                    except sqlite3.OperationalError as exc:
                        if not _transient(exc) or time.monotonic() >= end:
                            return False
                        time.sleep(0.05)
                        continue
                    self._pending.pop(0)
                return True
            finally:
                self._db.execute(f"PRAGMA busy_timeout={int(self.busy_s * 1000)}")

    def _write(self, fn: Write, what: str, queue: bool = True) -> None:
        """One write: now if the lock can be had within ``busy_s``; else queued (``queue``) or
        :class:`LedgerBusy`. Writes already queued go first, so the order is kept."""
        if self._read_only:
            raise LorapodError(f"the ledger {self.path} was opened read-only; {what} not recorded")
        with self._lock:
            if self._pending and not self.flush() and queue:
                self._pending.append((fn, what))
                return
            try:
                retry_busy(lambda: self._apply(fn), self.busy_s)
            except sqlite3.OperationalError as exc:
                if not _local_fault(exc):
                    raise
                if not queue:
                    why = "is locked by another process" if _transient(exc) else f"cannot be written ({exc})"
                    raise LedgerBusy(f"the ledger {self.path} {why}: {what} could not be recorded within "
                                     f"{self.busy_s:.0f} s; nothing was rented",
                                     hint="close the program holding it (a `sqlite3` shell, a backup), or free the "
                                          "disk / make LORAPOD_HOME writable, then run again") from exc
                if not self._pending and not _transient(exc):
                    self.notice = f"the ledger {self.path} cannot be written ({exc}): records are kept in memory"
                self._pending.append((fn, what))

    # ------------------------------------------------------------------ instances

    def instance_creating(self, provider: str, job_id: str | None, usd_per_hour: float,
                          gpu_name: str | None = None, offer: dict[str, Any] | None = None) -> str:
        """Write the row before asking the provider; returns lorapod's instance id."""
        ledger_id = "i-" + uuid.uuid4().hex[:12]
        row = (ledger_id, provider, job_id, gpu_name, usd_per_hour, json.dumps(offer or {}), time.time())
        self._write(lambda db: db.execute(
            "INSERT INTO instances (id, provider, job_id, state, gpu_name, usd_per_hour, offer_json, created_at)"
            " VALUES (?, ?, ?, 'creating', ?, ?, ?, ?)", row), "the instance row", queue=False)
        self.event("instance", f"creating on {provider} at ${usd_per_hour:.3f}/h", job_id=job_id, instance_id=ledger_id)
        return ledger_id

    def instance_created(self, ledger_id: str, provider_id: str, usd_per_hour: float | None = None) -> None:
        if usd_per_hour is None:
            self._write(lambda db: db.execute("UPDATE instances SET provider_id=?, state='live' WHERE id=?",
                                              (provider_id, ledger_id)), "instance created")
        else:
            self._write(lambda db: db.execute("UPDATE instances SET provider_id=?, state='live', usd_per_hour=?"
                                              " WHERE id=?", (provider_id, usd_per_hour, ledger_id)), "instance created")
        self.event("instance", f"created: provider id {provider_id}", instance_id=ledger_id)

    def instance_create_failed(self, ledger_id: str, reason: str) -> None:
        """The provider refused: nothing exists, nothing is billed (destroyed_at = created_at)."""
        self._write(lambda db: db.execute("UPDATE instances SET state='failed', destroyed_at=created_at, note=?"
                                          " WHERE id=?", (reason[:500], ledger_id)), "create failed")
        self.event("instance", f"create failed: {reason[:200]}", instance_id=ledger_id)

    def instance_access(self, ledger_id: str, access: dict[str, Any]) -> None:
        text = json.dumps(access)
        self._write(lambda db: db.execute("UPDATE instances SET access_json=? WHERE id=?", (text, ledger_id)), "access")

    def access(self, ledger_id: str) -> dict[str, Any]:
        row = self._db.execute("SELECT access_json FROM instances WHERE id=?", (ledger_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else {}

    def instance_ready(self, ledger_id: str, host: str, port: int, user: str) -> None:
        args = (host, port, user, time.time(), ledger_id)
        self._write(lambda db: db.execute("UPDATE instances SET ssh_host=?, ssh_port=?, ssh_user=?,"
                                          " ready_at=COALESCE(ready_at, ?) WHERE id=?", args), "instance ready")

    def instance_destroying(self, ledger_id: str, note: str | None = None) -> None:
        args = (time.time(), note, ledger_id)
        self._write(lambda db: db.execute(
            "UPDATE instances SET state='destroying', destroy_requested_at=COALESCE(destroy_requested_at, ?),"
            " note=COALESCE(?, note) WHERE id=? AND state IN ('creating', 'live', 'destroying')", args), "destroying")

    def instance_destroyed(self, ledger_id: str, note: str | None = None, at: float | None = None) -> None:
        """Only after the provider confirmed: the dollars stop here."""
        args = (at or time.time(), note, ledger_id)
        self._write(lambda db: db.execute("UPDATE instances SET state='destroyed', destroyed_at=COALESCE(destroyed_at, ?),"
                                          " note=COALESCE(?, note) WHERE id=?", args), "destroyed")
        self.event("instance", "destroyed (confirmed by the provider)" + (f": {note}" if note else ""), instance_id=ledger_id)

    def instance(self, ledger_id: str) -> InstanceRow | None:
        row = self._db.execute("SELECT * FROM instances WHERE id=?", (ledger_id,)).fetchone()
        return _instance(row) if row else None

    def instances(self, live_only: bool = False, provider: str | None = None) -> list[InstanceRow]:
        q, args = "SELECT * FROM instances", []
        where = []
        if live_only:
            where.append(f"state IN ({','.join('?' * len(LIVE))})")
            args += list(LIVE)
        if provider:
            where.append("provider=?")
            args.append(provider)
        if where:
            q += " WHERE " + " AND ".join(where)
        return [_instance(r) for r in self._db.execute(q + " ORDER BY created_at", args)]

    def job_instances(self, job_id: str) -> list[InstanceRow]:
        return [_instance(r) for r in self._db.execute(
            "SELECT * FROM instances WHERE job_id=? ORDER BY created_at", (job_id,))]

    def usd(self, job_id: str, now: float | None = None) -> float:
        return sum(r.usd(now) for r in self.job_instances(job_id))

    # ------------------------------------------------------------------ jobs

    def job_started(self, job_id: str, run_dir: str, provider: str, target: str | None, spec_path: str | None,
                    max_usd: float | None, max_hours: float | None) -> None:
        args = (job_id, spec_path, run_dir, provider, target, max_usd, max_hours, controller_id(), time.time())
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO jobs (id, spec_path, run_dir, provider, target, state, max_usd, max_hours,"
            " controller, started_at) VALUES (?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?)", args), "job started")
        self.event("job", f"started on {target or provider}", job_id=job_id)

    def job_update(self, job_id: str, **fields: Any) -> None:
        allowed = {"instance_id", "state", "remote_dir", "last_step", "ended_at", "summary", "controller"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown job fields {bad}")
        if not fields:
            return
        cols = ", ".join(f"{k}=?" for k in fields)
        args = (*fields.values(), job_id)
        self._write(lambda db: db.execute(f"UPDATE jobs SET {cols} WHERE id=?", args), "job update")

    def job_claim(self, job_id: str) -> str | None:
        """Make this process the job's controller, atomically; returns the live controller that
        already follows it instead (then nothing changes), so two `run --resume` never race."""
        def claim() -> str | None:
            with self._tx() as db:
                row = db.execute("SELECT state, controller FROM jobs WHERE id=?", (job_id,)).fetchone()
                if row is None:
                    return ""
                if row["state"] in ("starting", "running", "stopping") and row["controller"] != controller_id() \
                        and controller_alive(row["controller"]):
                    return str(row["controller"])
                db.execute("UPDATE jobs SET controller=?, state='starting', ended_at=NULL WHERE id=?",
                           (controller_id(), job_id))
            return None

        try:
            other = retry_busy(claim, self.busy_s)
        except sqlite3.OperationalError as exc:
            if not _transient(exc):
                raise
            raise LedgerBusy(f"the ledger {self.path} is locked by another process; job {job_id} was not resumed",
                             hint="close the program holding it (a `sqlite3` shell, a backup), then run again") from exc
        if other is None:
            self.event("job", f"resumed by {controller_id()}", job_id=job_id)
        return other or None

    def job_ended(self, job_id: str, state: str, summary: str) -> None:
        self.job_update(job_id, state=state, summary=summary, ended_at=time.time())
        self.event("job", f"{state}: {summary}", job_id=job_id)

    def job(self, job_id: str) -> JobRow | None:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:  # accept a unique prefix, as people type them
            rows = self._db.execute("SELECT * FROM jobs WHERE id LIKE ?", (job_id + "%",)).fetchall()
            row = rows[0] if len(rows) == 1 else None
        return JobRow(**dict(row)) if row else None

    def jobs(self) -> list[JobRow]:
        return [JobRow(**dict(r)) for r in self._db.execute("SELECT * FROM jobs ORDER BY started_at")]

    # ------------------------------------------------------------------ events and prices

    def event(self, kind: str, message: str, job_id: str | None = None, instance_id: str | None = None) -> None:
        args = (time.time(), job_id, instance_id, kind, message)
        self._write(lambda db: db.execute("INSERT INTO events (ts, job_id, instance_id, kind, message)"
                                          " VALUES (?, ?, ?, ?, ?)", args), "event")

    def event_before_create(self, kind: str, message: str, what: str, job_id: str | None = None) -> None:
        """An event that must be written before a provider's create call (invariant 1, for what is
        not an instance: a serverless endpoint's pending row): never queued, :class:`LedgerBusy`
        instead, before anything is created."""
        args = (time.time(), job_id, None, kind, message)
        self._write(lambda db: db.execute("INSERT INTO events (ts, job_id, instance_id, kind, message)"
                                          " VALUES (?, ?, ?, ?, ?)", args), what, queue=False)

    def events(self, job_id: str | None = None) -> list[dict[str, Any]]:
        if job_id:
            rows = self._db.execute("SELECT * FROM events WHERE job_id=? ORDER BY seq", (job_id,))
        else:
            rows = self._db.execute("SELECT * FROM events ORDER BY seq")
        return [dict(r) for r in rows]

    def last_event(self, job_id: str, kind: str, since: float) -> dict[str, Any] | None:
        """The newest event of ``kind`` for ``job_id`` written at or after ``since`` (wall clock):
        a controller reads the user's ``down`` and ``stop`` requests with it at every poll."""
        row = self._db.execute("SELECT * FROM events WHERE job_id=? AND kind=? AND ts>=? ORDER BY seq DESC LIMIT 1",
                               (job_id, kind, since)).fetchone()
        return dict(row) if row is not None else None

    def records(self, *kinds: str, job_id: str | None = None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(event, record) for the events of ``kinds`` whose message is a JSON object, in order:
        the structured events (phases, spot instances, preemptions, endpoints); any other message
        (a damaged or hand-edited row) is passed over."""
        for e in self.events(job_id):
            if e["kind"] not in kinds:
                continue
            try:
                rec = json.loads(e["message"])
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield e, rec

    def record_measurement(self, job_id: str, gpu_name: str | None, model: str, settings: dict[str, Any],
                           seconds_per_step: float | None, peak_gb: float | None, steps: int) -> None:
        """Remember what a finished job measured, for the planner (plan/learned.py)."""
        args = (job_id, time.time(), gpu_name, model, json.dumps(settings, sort_keys=True), seconds_per_step,
                peak_gb, steps)
        self._write(lambda db: db.execute(
            "INSERT OR REPLACE INTO measured_runs (job_id, recorded_at, gpu_name, model, settings_json,"
            " seconds_per_step, peak_gb, steps) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", args), "measurement")

    def measurements(self) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT * FROM measured_runs ORDER BY recorded_at").fetchall()
        return [{**dict(r), "settings": json.loads(r["settings_json"] or "{}")} for r in rows]

    def record_prices(self, offers: list[Any]) -> None:
        now = time.time()
        rows = [(o.provider, o.id, o.gpu_name, o.usd_per_hour, now) for o in offers]
        self._write(lambda db: db.executemany(
            "INSERT OR IGNORE INTO prices (provider, offer_id, gpu_name, usd_per_hour, seen_at) VALUES (?, ?, ?, ?, ?)",
            rows), "prices")


def _instance(row: sqlite3.Row) -> InstanceRow:
    d = dict(row)
    d.pop("offer_json", None)
    d.pop("access_json", None)
    return InstanceRow(**d)
