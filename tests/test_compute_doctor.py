"""`lorapod doctor` against the fake control planes and their loopback instances: the table, the
ledger record, the warning `lorapod run` prints until a provider has passed, and cleanup with the
account key when the scoped key fails."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lorapod.compute.doctor import cheapest_offer, doctor_note, ever_passed, run_doctor
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.vast.api import VastApi
from lorapod.compute.vast.provider import VastProvider
from lorapod.store.ledger import Ledger

from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake


def _names(report):
    return {c.name: c for c in report.checks}


@pytest.mark.parametrize("which", ["vast", "runpod"])
def test_doctor_passes_on_the_fakes_and_is_remembered(which, sshd_factory, remote_root):
    if which == "vast":
        fake = VastFake(sshd_factory, remote_root, key_delay_s=3.0)
        prov = VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))
    else:
        fake = RunPodFake(sshd_factory, remote_root)
        prov = RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                        backoff_s=0.05, timeout=10))
    try:
        ledger = Ledger()
        assert "never passed `lorapod doctor" in (doctor_note(ledger, which) or "")
        offer = cheapest_offer(prov)
        report = run_doctor(prov, offer, ledger, say=lambda m: None, poll_s=0.2)
        checks = _names(report)
        assert report.passed, [(c.name, c.evidence) for c in report.checks]
        assert list(checks) == ["offer", "create", "ssh + key", "rsync", "python", "scoped key", "price",
                                "self-destroy", "gone"]
        if which == "vast":
            assert "refused" in checks["ssh + key"].evidence  # the late key, waited for
        scoped = checks["scoped key"].evidence
        assert "session" in scoped and fake.account_key not in json.dumps(report.to_dict())
        assert all(i.deleted_by in ("container key", "pod-scoped key") for i in fake.instances.values())
        assert fake.live() == [] and ledger.instances(live_only=True) == []
        assert ever_passed(ledger, which) and doctor_note(ledger, which) is None
        (job,) = ledger.jobs()  # `lorapod ps` shows it; `down --orphans` spares it while doctor runs
        assert job.id.startswith(f"doctor-{which}-") and job.state == "done"
        assert [r.job_id for r in ledger.instances()] == [job.id]
        assert fake.violations == []
    finally:
        fake.close()


def test_doctor_failing_scoped_key_is_reported_and_cleaned_up_with_the_account_key(sshd_factory, remote_root):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2, refuse_destroys=2)
    try:
        prov = VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))
        ledger = Ledger()
        report = run_doctor(prov, cheapest_offer(prov), ledger, say=lambda m: None, poll_s=0.2)
        checks = _names(report)
        assert not report.passed
        assert checks["self-destroy"].ok is False and "not accepted" in checks["self-destroy"].evidence
        assert checks["cleanup"].ok and (inst := next(iter(fake.instances.values()))).deleted_by == "account key"
        assert inst.deleted and ledger.instances(live_only=True) == []
        assert "the last run failed: self-destroy" in doctor_note(ledger, "vast")
    finally:
        fake.close()


def test_doctor_cli_prints_the_cap_rents_nothing_without_yes_and_the_table_with_it(sshd_factory, remote_root, monkeypatch):
    from lorapod.cli.main import build_app

    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.5)
    try:
        monkeypatch.setenv("VAST_API_KEY", fake.account_key)
        monkeypatch.setenv("LORAPOD_VAST_URL", fake.url)
        out = CliRunner().invoke(build_app(), ["doctor", "vast"])
        assert out.exit_code == 0, out.output
        assert "cap 3.2 cents (at most 10 minutes)" in out.output  # RTX 3090 at $0.19/h
        assert "nothing was rented" in out.output and fake.instances == {}
        out = CliRunner().invoke(build_app(), ["doctor", "vast", "--yes"], env={"COLUMNS": "200"})
        assert out.exit_code == 0, out.output
        for row in ("ssh + key", "rsync", "python", "scoped key", "price", "self-destroy", "gone"):
            assert row in out.output
        assert "FAIL" not in out.output and "passed: stored in the ledger" in out.output
        assert fake.live() == [] and fake.account_key not in out.output
    finally:
        fake.close()
