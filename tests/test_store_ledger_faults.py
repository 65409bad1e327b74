"""The ledger never ends a run and never blinds a command (issue 22, item 2).

Faults on this machine's side: another process holding the ledger's write lock (what the
``sqlite3`` shell does inside ``BEGIN IMMEDIATE``, or a writer stuck in a long transaction), a
truncated, overwritten or 0-byte ledger file, a read-only LORAPOD_HOME. Each must leave the
healthy run finished, and `ps` / `down` usable.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

import lorapod.store.ledger as ledger_mod
from lorapod.compute.ledger_repair import backup, backups, damage
from lorapod.compute.local import LocalProvider
from lorapod.compute.session import run_remote
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger, LedgerBusy, LedgerDamaged

from .conftest_ssh import require_tools
from .remote_helpers import cli_argv, cli_env, fake_command, fast_options, make_spec


@pytest.fixture
def runpod_fake(sshd_factory, remote_root):
    from .fakes.runpod_fake import RunPodFake

    fake = RunPodFake(sshd_factory, remote_root)
    yield fake
    fake.close()


def hold_write_lock(path: Path, seconds: float, started: threading.Event | None = None,
                    release: threading.Event | None = None) -> threading.Thread:
    """Another connection takes the write lock and keeps it (as `sqlite3 ledger.db` + BEGIN
    IMMEDIATE) for ``seconds``, or until ``release`` is set."""
    def hold() -> None:
        con = sqlite3.connect(path, isolation_level=None, timeout=30)
        con.execute("BEGIN IMMEDIATE")
        if started is not None:
            started.set()
        if release is not None:
            release.wait(seconds)
        else:
            time.sleep(seconds)
        con.execute("COMMIT")
        con.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    return t


def test_a_ledger_locked_during_the_run_does_not_end_it(tmp_path, monkeypatch):
    require_tools("rsync")
    monkeypatch.setattr(ledger_mod, "BUSY_TIMEOUT_S", 0.3)  # lorapod waits 0.3 s, the lock lasts 3 s
    spec = make_spec(tmp_path, max_steps=30, every=10)
    ledger = Ledger()
    holders: list[threading.Thread] = []

    def say(msg: str) -> None:
        if msg.startswith("job started on the instance") and not holders:
            holders.append(hold_write_lock(ledger.path, 3.0))

    summary = run_remote(load_spec(spec), LocalProvider(home=tmp_path / "machine"), "local",
                         fast_options(job_command=fake_command(0.1)), ledger, str(spec), say=say)
    assert holders and not holders[0].is_alive()
    assert summary.state == "done", summary.message
    assert ledger.pending == 0
    fresh = Ledger()
    job = fresh.job(summary.job_id)
    assert (job.state, job.last_step) == ("done", 30)
    assert fresh.instances(live_only=True) == [] and fresh.instances()[0].state == "destroyed"
    assert any("destroyed (confirmed" in e["message"] for e in fresh.events())


def test_a_ledger_locked_before_the_run_is_a_clear_error_and_nothing_is_rented(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "BUSY_TIMEOUT_S", 0.3)
    ledger = Ledger()
    locked = threading.Event()
    holder = hold_write_lock(ledger.path, 3.0, locked)
    locked.wait(10)
    with pytest.raises(LedgerBusy, match=r"locked by another process.*nothing was rented") as exc:
        ledger.instance_creating("runpod", "j1", 0.2)
    assert "sqlite3" in exc.value.hint
    ledger.job_update("j1", last_step=3)  # lifecycle writes queue meanwhile
    assert ledger.pending == 1
    holder.join()
    assert ledger.flush(wait_s=5) and ledger.pending == 0


def test_a_locked_ledger_makes_run_say_what_to_do_without_a_traceback(tmp_path):
    spec = make_spec(tmp_path)
    path = Path(os.environ["LORAPOD_HOME"]) / "ledger.db"
    Ledger(path).close()
    locked, release = threading.Event(), threading.Event()
    holder = hold_write_lock(path, 120.0, locked, release)  # held for as long as the run takes to start
    locked.wait(10)
    try:
        out = subprocess.run([*cli_argv(), "run", str(spec), "--on", "local", "--python", "python3"],
                             capture_output=True, text=True, timeout=90, env=cli_env(LORAPOD_LEDGER_BUSY_S="0.3"))
    finally:
        release.set()
        holder.join()
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and "locked by another process" in out.stderr, out.stderr
    assert Ledger().instances() == []


@pytest.mark.parametrize("how", ["empty", "truncated", "overwritten"])
def test_a_damaged_ledger_is_set_aside_and_the_backup_restored(tmp_path, how):
    path = tmp_path / "ledger.db"
    ledger = Ledger(path)
    ledger.job_started("kept-job", str(tmp_path / "run"), "runpod", "runpod", None, None, None)
    for _ in range(300):  # enough pages that a cut-off file is visibly broken
        ledger.event("x", "y" * 200, job_id="kept-job")
    assert backup(ledger, force=True) is not None
    ledger.job_started("newer-job", str(tmp_path / "run2"), "runpod", "runpod", None, None, None)
    ledger._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ledger.close()
    data = path.read_bytes()
    broken = {"empty": b"", "truncated": data[: len(data) // 3], "overwritten": b"not a database at all" * 100}[how]
    path.write_bytes(broken)
    assert damage(path) is not None
    with pytest.raises(LedgerDamaged, match="damaged"):
        Ledger.read_only(path)
    again = Ledger(path)  # a writing command: sets it aside, restores the newest good backup
    assert "was damaged" in again.notice and "ledger rebuild" in again.notice
    assert [j.id for j in again.jobs()] == ["kept-job"]
    aside = [p for p in tmp_path.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == broken  # kept as it was, never deleted
    assert any(e["kind"] == "ledger" and "was damaged" in e["message"] for e in again.events())


def test_backups_use_the_backup_api_and_keep_five(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.job_started("j", str(tmp_path), "local", "local", None, None, None)
    made = [backup(ledger, force=True) for _ in range(7)]
    assert all(made) and len(backups(ledger.path)) == 5
    assert backup(ledger) is None  # the newest is younger than an hour
    copy = sqlite3.connect(backups(ledger.path)[-1])
    assert copy.execute("SELECT id FROM jobs").fetchall() == [("j",)]


def read_only_mount(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` run where ``folder`` is a read-only bind mount (a mount namespace of its own;
    permissions alone do not stop root). Skips where namespaces are not allowed."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user+mount namespaces here: {probe.stderr.decode()[-200:]}")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, str(folder), *argv]


def test_ps_reads_a_read_only_home(tmp_path):
    home = Path(os.environ["LORAPOD_HOME"])
    ledger = Ledger()
    ledger.job_started("ro-job", str(tmp_path), "local", "local", None, None, None)
    ledger.close()  # the last connection removes -wal and -shm: a read-only open cannot make them
    assert not (home / "ledger.db-shm").exists()
    out = subprocess.run(read_only_mount(home, [*cli_argv(), "ps", "--json"]), capture_output=True, text=True,
                         timeout=60, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert "ro-job" in out.stdout


def test_ps_with_a_damaged_ledger_still_answers_and_says_what_to_do(tmp_path):
    path = Path(os.environ["LORAPOD_HOME"]) / "ledger.db"
    path.write_bytes(b"")
    out = subprocess.run([*cli_argv(), "ps"], capture_output=True, text=True, timeout=60, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "damaged" in out.stderr and "lorapod ledger rebuild" in out.stderr
    assert path.read_bytes() == b""  # ps only reads: the damaged file is left for rebuild to set aside


def test_ledger_rebuild_recovers_what_bills_from_the_provider_and_the_run_folders(runpod_fake, tmp_path):
    """A 0-byte ledger and no backup: `ledger check` says what is missing, `ledger rebuild` records
    the pod the provider lists with this installation's label and the job of the run folder, and
    `down --orphans` then destroys the pod."""
    from lorapod.compute.provider import InstanceSpec, Offer
    from lorapod.store.identity import instance_label

    from .test_compute_session_faults import env_for, provider

    env = env_for(runpod_fake)
    label = instance_label("i-0123456789ab", "lost-job")
    pod = provider(runpod_fake).create(Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22),
                                       InstanceSpec("lost-job", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 t",
                                                    name=label))
    runs = tmp_path / "runs"
    (runs / "lost-job").mkdir(parents=True)
    (runs / "lost-job" / "spec.yaml").write_text("model: {id: x}\n")
    (runs / "lost-job" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 7}\n')
    (runs / "lost-job" / "remote-events.log").write_text("2026-12-02T10:00:00+0000 renting RTX 3090\n")  # `run`'s
    (Path(os.environ["LORAPOD_HOME"]) / "ledger.db").write_bytes(b"")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, timeout=60, env=env)

    ps = cli("ps", "--json")
    assert ps.returncode == 0 and [r["instance"] for r in json.loads(ps.stdout)] == [pod.id], ps.stderr
    checked = cli("ledger", "check", "--runs", str(runs))
    assert checked.returncode != 0 and "damaged" in checked.stderr, checked.stderr
    rebuilt = cli("ledger", "rebuild", "--runs", str(runs), "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout) == {"instances": 1, "jobs": 1}
    assert "set aside" in rebuilt.stderr
    ledger = Ledger()
    (row,) = ledger.instances(live_only=True)
    assert (row.id, row.provider_id, row.job_id) == ("i-0123456789ab", pod.id, "lost-job")
    assert ledger.job("lost-job").last_step == 7
    assert cli("ledger", "check", "--runs", str(runs)).returncode == 0
    down = cli("down", "--orphans", "--json")
    assert down.returncode == 0 and json.loads(down.stdout)["destroyed"] == 1, down.stderr
    assert runpod_fake.live() == [] and Ledger().instances(live_only=True) == []


def test_down_works_without_the_ledger_from_the_providers_labels(runpod_fake, tmp_path):
    """A damaged ledger in a read-only home (it cannot even be set aside): `down JOB` still
    destroys the job's pod, found by its label, with the provider's confirmation."""
    from lorapod.compute.provider import InstanceSpec, Offer
    from lorapod.store.identity import instance_label

    from .test_compute_session_faults import env_for, provider

    offer = Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 t"
    mine = provider(runpod_fake).create(offer, InstanceSpec("j1", key, name=instance_label("i-00000000000a", "j1")))
    other = provider(runpod_fake).create(offer, InstanceSpec("j2", key, name=instance_label("i-00000000000b", "j2")))
    home = Path(os.environ["LORAPOD_HOME"])
    (home / "ledger.db").write_bytes(b"overwritten")
    out = subprocess.run(read_only_mount(home, [*cli_argv(), "down", "j1", "--json"]), capture_output=True,
                         text=True, timeout=120, env=env_for(runpod_fake))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"destroyed": 1, "failed": 0}
    assert "from the providers' listings" in " ".join(out.stderr.split()) and "Traceback" not in out.stderr
    assert [i.id for i in runpod_fake.live()] == [other.id] and runpod_fake.instances[mine.id].deleted
