"""Fast unit tests of the remote-run pieces: registry, offers, ledger invariants, watchdog rules,
credentials, addresses and the on-instance command."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from lorapod.compute import provider as registry
from lorapod.compute.httpapi import api_key, save_api_key
from lorapod.compute.ledger import Ledger
from lorapod.compute.offers import choose_offers
from lorapod.compute.provider import Capability, Instance, InstanceSpec, Offer, Requirements, rank_offers
from lorapod.compute.remote import default_job_command, job_command_from_env
from lorapod.compute.ssh import SSHTarget
from lorapod.compute.watchdog import DEFAULTS, cap_seconds, decide
from lorapod.errors import PlanError, ProviderError
from lorapod.spec import load_spec

# ----------------------------------------------------------------------------- registry


def test_registry_refuses_duplicates_and_builtin_names():
    name = f"myprov_{os.getpid()}_{time.monotonic_ns()}"
    registry.register(name, lambda **kw: "x")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(name, lambda **kw: "y")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("runpod", lambda **kw: "z")
    assert registry.get(name) == "x"
    assert {"ssh", "local", "runpod", "vast", name} <= set(registry.names())


def test_unknown_provider_lists_the_known_ones():
    with pytest.raises(ProviderError, match="unknown provider 'aws'") as exc:
        registry.get("aws")
    assert "runpod" in exc.value.hint and "ssh://" in exc.value.hint


def test_ssh_target_parse():
    assert SSHTarget.parse("ssh://bob@example.org:2222") == SSHTarget("bob", "example.org", 2222)
    assert SSHTarget.parse("ssh://example.org") == SSHTarget("root", "example.org", 22)
    with pytest.raises(ProviderError):
        SSHTarget.parse("http://x")


# ----------------------------------------------------------------------------- offers


class OffersOnly:
    name = "fakeprov"

    def __init__(self, offers):
        self._offers = offers

    def offers(self, req):
        return self._offers


OFFERS = [Offer("p", "a", "RTX 4090", 0.69, 24), Offer("p", "b", "RTX 3090", 0.22, 24),
          Offer("p", "c", "A100 80GB", 1.19, 80), Offer("p", "d", "RTX 3090", 0.30, 24, reliability=0.99)]


def test_rank_offers_filters_and_sorts_by_price():
    assert [o.id for o in rank_offers(OFFERS, Requirements())] == ["b", "d", "a", "c"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(gpu="rtx 3090"))] == ["b", "d"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(min_vram_gb=40))] == ["c"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(max_usd_per_hour=0.5))] == ["b", "d"]


def test_choose_offers_explains_empty_results(tmp_path):
    spec = load_spec(raw={"model": {"id": "m"}, "data": {"path": "x"}, "compute": {"max_usd": 1, "max_hours": 10}})
    with pytest.raises(PlanError, match=r"no fakeprov offer costs under \$0.100/h") as exc:
        choose_offers(spec, OffersOnly(OFFERS))
    assert "--max-usd" in exc.value.hint
    with pytest.raises(PlanError, match=r"fakeprov has no offer for GPU .H100."):
        choose_offers(spec, OffersOnly(OFFERS), gpu="H100", max_usd=100)
    assert [o.id for o in choose_offers(spec, OffersOnly(OFFERS), max_usd=5)] == ["b", "d"]


# ----------------------------------------------------------------------------- ledger


def test_ledger_retries_sqlite_busy_answers_until_its_deadline():
    """Two processes opening a new ledger at once can deadlock switching it to WAL: SQLite answers
    "database is locked" at once (no busy wait), which failed a parallel sweep in CI."""
    import sqlite3

    from lorapod.compute.ledger import retry_busy

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

    code = "import sys; from lorapod.compute.ledger import Ledger; l = Ledger(sys.argv[1]); l.instances(); l.close()"
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


# ----------------------------------------------------------------------------- watchdog rules


def facts(**kw):
    base = {"job_started": True, "job_done": False, "done_at": None, "pulled": False, "heartbeat": None,
            "progress": None, "stop_written_at": None}
    base.update(kw)
    return base


CFG = {**DEFAULTS, "heartbeat_timeout_s": 60, "done_grace_s": 600, "stall_s": 300, "stop_wait_s": 30,
       "cap_margin_s": 20}


@pytest.mark.parametrize(("cfg", "now", "f", "action"), [
    ({}, 100, facts(job_done=True, done_at=90, pulled=True, heartbeat=99), "destroy"),  # pulled: go now
    ({}, 100, facts(job_done=True, done_at=90, heartbeat=99), "wait"),  # done, controller pulling
    ({}, 200, facts(job_done=True, done_at=90, heartbeat=100), "destroy"),  # done, controller silent 100 s
    ({}, 800, facts(job_done=True, done_at=100, heartbeat=799), "destroy"),  # done, grace over
    ({}, 100, facts(progress=90, heartbeat=5), "wait"),  # running: a silent controller alone is no reason
    ({}, 400, facts(progress=50, heartbeat=399), "stop"),  # stalled 350 s: checkpoint and stop
    ({}, 400, facts(progress=50, stop_written_at=350), "kill"),  # STOP ignored for 50 s
    ({"max_hours": 0.1, "elapsed_at_start_s": 0}, 345, facts(progress=344), "stop"),  # cap (360 s) in 15 s
    ({"max_hours": 0.1, "elapsed_at_start_s": 0}, 361, facts(progress=360, stop_written_at=345), "destroy"),
    ({"max_usd": 1.0, "usd_per_hour": 36.0, "elapsed_at_start_s": 50}, 51, facts(progress=50), "destroy"),
    ({}, 100, facts(job_started=False, heartbeat=90), "wait"),
    ({}, 100, facts(job_started=False, heartbeat=10), "destroy"),  # never started, controller gone
])
def test_watchdog_decisions(cfg, now, f, action):
    assert decide({**CFG, **cfg}, now, 0.0, f) == action


def test_cap_seconds_takes_the_tighter_cap():
    assert cap_seconds({"max_hours": 2, "max_usd": 1, "usd_per_hour": 1.0}) == 3600
    assert cap_seconds({"max_hours": None, "max_usd": None}) is None


# ----------------------------------------------------------------------------- credentials, commands


def test_api_key_from_env_then_private_file(monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "from-env")
    assert api_key("RUNPOD_API_KEY", "runpod") == "from-env"
    monkeypatch.delenv("RUNPOD_API_KEY")
    with pytest.raises(ProviderError, match="no runpod API key") as exc:
        api_key("RUNPOD_API_KEY", "runpod")
    assert "chmod 600" in exc.value.hint
    path = save_api_key("runpod", "from-file")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert api_key("RUNPOD_API_KEY", "runpod") == "from-file"
    os.chmod(path, 0o644)
    with pytest.raises(ProviderError, match="readable by others"):
        api_key("RUNPOD_API_KEY", "runpod")


def test_job_command_default_and_override(monkeypatch):
    assert default_job_command("python3", "spec.yaml", "run", False) == [
        "python3", "-m", "lorapod", "train", "spec.yaml", "--run-dir", "run"]
    assert job_command_from_env("py", "s.yaml", "run", True) == [  # resumes from run/checkpoints by itself
        "py", "-m", "lorapod", "train", "s.yaml", "--run-dir", "run"]
    monkeypatch.setenv("LORAPOD_JOB_COMMAND", "{python} my_train.py --cfg {spec} --out {run_dir} {resume}")
    assert job_command_from_env("py", "s.yaml", "run", False) == ["py", "my_train.py", "--cfg", "s.yaml", "--out", "run"]


def test_capabilities_have_reasons():
    from lorapod.compute.ssh import SSHProvider

    caps = SSHProvider("ssh://u@h:22").capabilities()
    assert all(isinstance(c, Capability) and c.reason for c in caps)
    assert not next(c for c in caps if c.name == "stop").supported
    InstanceSpec("x", "ssh-ed25519 AAA")  # constructible with defaults


def test_remote_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, lorapod.cli.run, lorapod.cli.jobs, lorapod.compute.session, lorapod.compute.jobs, "
            "lorapod.compute.runpod.provider, lorapod.compute.vast.provider; "
            "bad = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    from .remote_helpers import cli_env

    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env())
