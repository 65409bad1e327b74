"""store/ledger.py: the ledger's invariants (a row before create returns, dollars from create to
confirmed destroy, WAL and private, busy answers retried)."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from lorapod.compute.provider import Instance, Offer, Traits
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger


def test_ledger_retries_sqlite_busy_answers_until_its_deadline():
    """Two processes opening a new ledger at once can deadlock switching it to WAL: SQLite answers
    "database is locked" at once (no busy wait), which failed a parallel sweep in CI."""
    import sqlite3

    from lorapod.store.ledger import retry_busy

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "ok"

    assert retry_busy(flaky, deadline_s=5, pause_s=0.001) == "ok" and len(calls) == 3
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        retry_busy(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")), deadline_s=0.05,
                   pause_s=0.01)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):  # not transient: at once
        retry_busy(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("no such table: x")), deadline_s=5)


def test_many_processes_open_a_new_ledger_at_once(tmp_path):
    import subprocess
    import sys

    code = "import sys; from lorapod.store.ledger import Ledger; l = Ledger(sys.argv[1]); l.instances(); l.close()"
    path = tmp_path / "ledger.db"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE) for _ in range(6)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-1000:]
    assert _journal_mode(path) == "wal"


def _journal_mode(path):
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA journal_mode").fetchone()[0]


class RecordingProvider:
    """create() looks at the ledger while it runs: the row must already be there."""

    name = "rec"
    traits = Traits()  # a rented machine (compute/provider.py: every provider declares its traits)

    def __init__(self, ledger):
        self.ledger = ledger
        self.seen = None

    def create(self, offer, spec):
        self.seen = [(r.state, r.provider_id) for r in self.ledger.instances()]
        return Instance("prov-1", "rec", "booting", usd_per_hour=offer.usd_per_hour)


def test_ledger_row_exists_before_create_returns(tmp_path):
    from lorapod.compute.acquire import _create
    from lorapod.compute.session import Session

    ledger = Ledger()
    spec = load_spec(raw={"model": {"id": "m"}, "data": {"path": "x"}, "output": {"dir": str(tmp_path), "name": "j"}})
    prov = RecordingProvider(ledger)
    s = Session(spec, prov, "rec", ledger=ledger, say=lambda m: None)
    _create(s.ctx, Offer("rec", "o1", "GPU", 1.5), None, "ssh-ed25519 AAAA")
    assert prov.seen == [("creating", None)]
    (row,) = ledger.instances()
    assert (row.state, row.provider_id, row.usd_per_hour) == ("live", "prov-1", 1.5)


def test_ledger_dollars_from_create_to_confirmed_destroy(tmp_path):
    ledger = Ledger()
    iid = ledger.instance_creating("runpod", "job1", 3.6, "RTX 3090")
    ledger.instance_created(iid, "pod-9")
    with ledger._tx() as db:  # pretend it was created 100 s ago
        db.execute("UPDATE instances SET created_at = created_at - 100 WHERE id=?", (iid,))
    ledger.instance_destroying(iid)
    assert ledger.instance(iid).live  # not destroyed until the provider confirms
    assert 0.099 < ledger.usd("job1") < 0.11
    ledger.instance_destroyed(iid)
    first = ledger.usd("job1")
    time.sleep(0.05)
    assert ledger.usd("job1") == first  # the meter stopped
    assert ledger.instance(iid).state == "destroyed"


def test_ledger_is_wal_and_private(tmp_path):
    ledger = Ledger()
    mode = sqlite3.connect(ledger.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert oct(ledger.path.stat().st_mode & 0o777) == "0o600"
    assert str(ledger.path).startswith(os.environ["LORAPOD_HOME"])


def test_failed_create_bills_nothing(tmp_path):
    ledger = Ledger()
    iid = ledger.instance_creating("vast", "j", 2.0)
    ledger.instance_create_failed(iid, "no capacity")
    assert ledger.usd("j") == 0.0 and ledger.instances(live_only=True) == []
