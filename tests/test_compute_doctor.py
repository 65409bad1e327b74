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
from .remote_helpers import cli_env


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
        assert list(checks) == ["offer", "create", "ssh + key", "rsync", "python", "dead man's switch", "scoped key",
                                "price", "self-destroy", "gone"]
        assert checks["dead man's switch"].ok  # the start command armed it; this doctor disarmed it
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


def _runpod(fake) -> RunPodProvider:
    return RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=10))


def test_an_interrupted_doctor_is_never_recorded_as_passed(sshd_factory, remote_root):
    """Ctrl-C right after the create: offer, create and cleanup held and nothing else ran. Before,
    that was recorded as a pass, and `lorapod run` stopped warning that the provider never passed."""
    fake = RunPodFake(sshd_factory, remote_root)
    try:
        prov = _runpod(fake)
        ledger = Ledger()

        def say(msg: str) -> None:
            if msg.startswith("created "):
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_doctor(prov, cheapest_offer(prov), ledger, say=say, poll_s=0.2)
        assert fake.live() == [] and ledger.instances(live_only=True) == []  # cleaned up with the account key
        (ev,) = [e for e in ledger.events() if e["kind"] == "doctor"]
        rep = json.loads(ev["message"])
        assert rep["passed"] is False and {"create": True, "cleanup": True, "finished": False}.items() <= {
            c["name"]: c["ok"] for c in rep["checks"]}.items()
        assert not ever_passed(ledger, "runpod") and "never passed" in doctor_note(ledger, "runpod")
        (job,) = ledger.jobs()
        assert job.state == "failed"
    finally:
        fake.close()


def test_a_doctor_killed_outright_leaves_a_watchdog_that_destroys_its_instance(sshd_factory, remote_root):
    """SIGKILL once the doctor's instance answers SSH: no `finally`, no account-key cleanup. The
    watchdog it started, capped at the doctor's minutes, destroys the pod from inside with the
    pod-scoped key. Before: the doctor started no watchdog and the pod billed on."""
    import signal
    import subprocess
    import sys
    import time

    fake = RunPodFake(sshd_factory, remote_root)
    child = (
        "import sys\n"
        "from lorapod.compute.doctor import cheapest_offer, run_doctor\n"
        "from lorapod.compute.runpod.api import RunPodApi\n"
        "from lorapod.compute.runpod.provider import RunPodProvider\n"
        f"prov = RunPodProvider(RunPodApi({fake.account_key!r}, base_url={fake.url!r}, "
        f"graphql_url={fake.graphql_url!r}, backoff_s=0.05, timeout=10))\n"
        "run_doctor(prov, cheapest_offer(prov), say=lambda m: print(m, flush=True), minutes=0.1, poll_s=0.2)\n"
        "print('DOCTOR-DONE', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=cli_env())
    seen = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("DOCTOR-DONE"):
                break
            if line.startswith("watchdog started on the instance"):
                proc.send_signal(signal.SIGKILL)  # the doctor dies before its own self-destroy check
                break
        proc.wait(10)
        assert any(x.startswith("watchdog started") for x in seen), seen
        end = time.monotonic() + 45
        while fake.live() and time.monotonic() < end:
            time.sleep(0.2)
        (pod,) = fake.instances.values()
        assert fake.live() == [] and pod.deleted_by == "pod-scoped key", (pod.deleted_by, seen)
        assert fake.violations == []
    finally:
        if proc.poll() is None:
            proc.kill()
        fake.close()


# -- doctor --spot (issue 36, item 6): a bid accepted, the instance destroying itself

@pytest.mark.parametrize("which", ["runpod", "vast"])
def test_doctor_spot_proves_the_bid_and_the_self_destroy_on_the_fakes(which, sshd_factory, remote_root):
    if which == "vast":
        fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2)
        prov = VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))
    else:
        fake = RunPodFake(sshd_factory, remote_root)
        prov = _runpod(fake)
    try:
        ledger = Ledger()
        on_demand = cheapest_offer(prov)
        offer = cheapest_offer(prov, spot=True)
        assert offer.interruptible and offer.usd_per_hour < on_demand.usd_per_hour  # priced at the bid
        report = run_doctor(prov, offer, ledger, say=lambda m: None, poll_s=0.2)
        checks = _names(report)
        assert report.passed and report.spot, [(c.name, c.ok, c.evidence) for c in report.checks]
        assert checks["bid"].ok and checks["bid"].evidence.startswith("interruptible, $")
        if which == "runpod":
            # the pod was rented with lorapod's init as its command, and PID 1 runs it
            assert len(fake.docker_args) == 1 and ".lorapod-init.sh" in fake.docker_args[0]
            assert checks["sigterm path"].ok and "SIGTERM reaches the job" in checks["sigterm path"].evidence
        else:
            assert "sigterm path" not in checks  # Vast.ai documents no signal
        assert all(i.deleted_by in ("container key", "pod-scoped key") for i in fake.instances.values())
        assert fake.live() == [] and ledger.instances(live_only=True) == []
        assert json.loads(ledger.events()[-1]["message"])["spot"] is True
    finally:
        fake.close()


def test_doctor_spot_fails_sigterm_path_when_pid_1_is_not_lorapods_init(sshd_factory, remote_root, monkeypatch):
    """An image whose start command lorapod does not know gets no init: the doctor says the
    preemption's SIGTERM would not reach the job, and the run does not pass."""
    import lorapod.compute.runpod.provider as rp

    monkeypatch.setattr(rp, "KNOWN", {})
    fake = RunPodFake(sshd_factory, remote_root)
    try:
        prov = _runpod(fake)
        report = run_doctor(prov, cheapest_offer(prov, spot=True), Ledger(), say=lambda m: None, poll_s=0.2)
        checks = _names(report)
        assert not report.passed and checks["sigterm path"].ok is False
        assert "would not reach the job" in checks["sigterm path"].evidence
        assert fake.docker_args == [] and fake.live() == []  # destroyed all the same
    finally:
        fake.close()


def test_doctor_spot_cli_prints_the_bid_and_refuses_a_ceiling_below_every_bid(sshd_factory, remote_root, monkeypatch):
    from lorapod.cli.main import build_app

    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2)
    try:
        monkeypatch.setenv("VAST_API_KEY", fake.account_key)
        monkeypatch.setenv("LORAPOD_VAST_URL", fake.url)
        out = CliRunner().invoke(build_app(), ["doctor", "vast", "--spot"])
        assert out.exit_code == 0, out.output
        assert "vast spot: " in out.output and "(the bid)" in out.output and fake.instances == {}
        out = CliRunner().invoke(build_app(), ["doctor", "vast", "--spot", "--max-bid", "0.001"])
        assert out.exit_code != 0 and "no spot (interruptible) offer within the bid ceiling" in str(out.exception or
                                                                                                 out.output)
    finally:
        fake.close()
