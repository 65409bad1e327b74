"""The whole remote lifecycle against a real sshd on loopback, with the stand-in trainer."""

from __future__ import annotations

import json
import os
import threading
import time

from lorapod.compute.remote import local_manifest
from lorapod.compute.session import run_remote
from lorapod.compute.ssh import SSHProvider
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .remote_helpers import fake_command, fast_options, make_spec


def run(sshd, tmp_path, spec_kw=None, say=None, **opt_kw):
    spec_path = make_spec(tmp_path, **(spec_kw or {}))
    spec = load_spec(spec_path)
    provider = SSHProvider(sshd.target, identity=sshd.client_key, usd_per_hour=opt_kw.pop("usd_per_hour", 0.0))
    opts = fast_options(identity=sshd.client_key, job_command=opt_kw.pop("job_command", fake_command()), **opt_kw)
    ledger = Ledger()
    lines: list[str] = []
    summary = run_remote(spec, provider, sshd.target, opts, ledger, str(spec_path), say=say or lines.append)
    return summary, ledger, lines


def assert_clean(sshd, ledger):
    assert list(sshd.work_root.iterdir()) == [], "work folder left on the host"
    assert ledger.instances(live_only=True) == []
    for row in ledger.instances():
        assert row.state in ("destroyed", "failed") and row.destroyed_at is not None


def test_e2e_over_ssh_brings_everything_home(sshd, tmp_path):
    summary, ledger, lines = run(sshd, tmp_path)
    assert summary.state == "done", summary.message
    assert summary.last_step == 8
    run_dir = summary.run_dir
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-4", "step-8"]
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["examples"] == 20
    assert (run_dir / "spec.yaml").read_text().count(str(tmp_path)) >= 1  # the local spec, not the remote one
    assert (run_dir / "job.log").read_text().strip().endswith("done")
    assert any("final pull verified" in x for x in lines)
    assert_clean(sshd, ledger)
    job = ledger.job(summary.job_id)
    assert job.state == "done" and job.last_step == 8
    assert summary.billed_after_pull_s is not None and summary.billed_after_pull_s < 15


def test_budget_cap_checkpoints_pulls_and_destroys(sshd, tmp_path):
    # $36/h with a $0.12 cap = 12 s of budget (setup takes ~3 s of it); STOP 6 s before the cap; the job would need 20 s.
    summary, ledger, lines = run(sshd, tmp_path, spec_kw={"max_steps": 100, "every": 1000},
                                 usd_per_hour=36.0, max_usd=0.12, stop_margin_s=6.0, job_command=fake_command(0.2))
    assert summary.state == "stopped", summary.message + "\n" + "\n".join(lines)
    assert "max-usd" in summary.message and "--resume" in summary.message
    ckpts = list((summary.run_dir / "checkpoints").iterdir())
    assert len(ckpts) == 1 and ckpts[0].name == f"step-{summary.last_step}"
    assert 1 <= summary.last_step < 100
    assert not (summary.run_dir / "adapter").exists()
    assert_clean(sshd, ledger)
    assert summary.usd <= 0.12  # the cap was never crossed


def test_failed_job_is_reported_and_torn_down(sshd, tmp_path):
    import pytest

    from lorapod.errors import RemoteError

    lines: list[str] = []
    # a watchdog polling every 20 ms removes the work folder at once after PULLED: the job log's
    # tail must be read before it
    wd = {**fast_options().watchdog, "poll_s": 0.02}
    with pytest.raises(RemoteError, match="exit 3"):
        run(sshd, tmp_path, say=lines.append, watchdog=wd, job_command=fake_command(0.05, ("--fail-at", "3")))
    assert any(x.startswith("job log (last lines)") and "boom at step 3" in x for x in lines), lines
    ledger = Ledger()
    assert_clean(sshd, ledger)
    (job,) = ledger.jobs()
    assert job.state == "failed" and job.last_step == 2
    run_dir = tmp_path / "runs" / job.id
    assert "boom at step 3" in (run_dir / "job.log").read_text()


def test_ssh_drop_mid_run_reconnects(sshd, tmp_path):
    dropped = []

    def say(msg):
        if msg.startswith("step 3") and not dropped:
            dropped.append(sshd.drop_connections())

    summary, ledger, _ = run(sshd, tmp_path, say=say, job_command=fake_command(0.25))
    assert dropped and dropped[0] >= 1
    assert summary.state == "done" and summary.last_step == 8
    assert (summary.run_dir / "adapter").is_dir()
    assert_clean(sshd, ledger)


def test_sshd_restart_mid_run_reconnects(sshd, tmp_path):
    """The server goes away for ~1.5 s (like a network outage); the controller keeps retrying."""
    restarted = threading.Event()

    def say(msg):
        if msg.startswith("step 2") and not restarted.is_set():
            restarted.set()
            sshd.stop()

            def back():
                time.sleep(1.5)
                sshd.start()

            threading.Thread(target=back, daemon=True).start()

    summary, ledger, _lines = run(sshd, tmp_path, say=say, job_command=fake_command(0.3))
    assert restarted.is_set()
    assert summary.state == "done" and summary.last_step == 8
    assert_clean(sshd, ledger)


def test_resync_of_unchanged_data_sends_no_content(sshd, tmp_path):
    from lorapod.compute.remote import RemoteWork
    from lorapod.compute.transport import SSHTransport

    data = tmp_path / "ds"
    data.mkdir()
    for i in range(5):
        (data / f"{i}.txt").write_bytes(os.urandom(20000))
    t = SSHTransport("127.0.0.1", sshd.port, sshd.user, sshd.client_key, tmp_path / "kh")
    w = RemoteWork(t, "resync")
    w.prepare()
    first = w.push_path(data, "data/ds")
    second = w.push_path(data, "data/ds")
    # rsync's quick check compares size and mtime: a same-size rewrite within the same second as
    # the last sync would look unchanged, so the edit changes the size, as real edits do
    (data / "3.txt").write_bytes(os.urandom(20001))
    third = w.push_path(data, "data/ds")
    t.close()
    assert first.files_transferred == 5 and first.literal_bytes >= 100000
    assert second.files_transferred == 0 and second.literal_bytes == 0
    assert third.files_transferred == 1
    assert local_manifest(data) == local_manifest(sshd.work_root / "resync" / "data" / "ds")


def test_host_key_is_pinned_and_a_changed_key_refused(sshd, tmp_path):
    import pytest

    from lorapod.compute.transport import SSHTransport
    from lorapod.errors import RemoteError

    known = tmp_path / "known_hosts_i1"
    t = SSHTransport("127.0.0.1", sshd.port, sshd.user, sshd.client_key, known)
    assert t.run("echo hi").stdout.strip() == b"hi"
    t.close()
    assert "ssh-ed25519" in known.read_text()  # pinned on first use (accept-new)
    sshd.stop()
    (sshd.dir / "host_ed25519").unlink()
    (sshd.dir / "host_ed25519.pub").unlink()
    from .conftest_ssh import keygen

    keygen(sshd.dir / "host_ed25519", "another host")
    sshd.start()
    t2 = SSHTransport("127.0.0.1", sshd.port, sshd.user, sshd.client_key, known)
    with pytest.raises(RemoteError, match="host key changed"):
        t2.run("echo hi")
    t2.close()
