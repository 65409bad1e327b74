"""A third provider, built only in the tests (tests/plugins/acme_lorapod.py: one class outside
``lorapod.compute``, one ``register`` call), gets everything a built-in gets (issue 47, part 4):
the planner prices its disk running and stopped and its spot tier's preemptions by the facts its
class declares (catalog/billing.py ``Billing``; the planner never reads a provider's name),
``lorapod doctor`` checks its instances by its class's ``DoctorFacts``, on-demand and ``--spot``,
its offers' spot fields are typed, and through lorapod's own CLI (the plugin's console script) it
plans with ``--live``, passes ``doctor --spot`` and runs a job with the dead man's switch, ending
with nothing billing. Its control plane is the RunPod fake, under its own name and facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lorapod.catalog.billing import HOURS_PER_MONTH, billing_for, register_billing
from lorapod.compute import provider as registry
from lorapod.compute.doctor import cheapest_offer, doctor_note, run_doctor
from lorapod.compute.offers import choose_offers, planned_job
from lorapod.compute.provider import Requirements
from lorapod.plan.choose import plan_job
from lorapod.plan.spot import spot_job
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .plugins import acme_lorapod
from .plugins.acme_lorapod import DISK_RUNNING, DISK_STOPPED, NAME, SIGTERM_GRACE_S, AcmeProvider
from .remote_helpers import cli_env, fake_command_template, make_spec

PLUGIN_CLI = Path(acme_lorapod.__file__)


def acme_env(runpod) -> dict[str, str]:
    return {"ACME_API_KEY": runpod.account_key, "ACME_URL": runpod.url, "ACME_GRAPHQL_URL": runpod.graphql_url}


@pytest.fixture
def acme(runpod, monkeypatch):
    from lorapod.catalog import billing

    for k, v in acme_env(runpod).items():
        monkeypatch.setenv(k, v)
    acme_lorapod.register()
    try:
        yield AcmeProvider()
    finally:  # a registration lives for the process: the next test starts without it
        registry._REGISTRY.pop(NAME, None)
        billing._BY_PROVIDER.pop(NAME, None)


def test_registering_a_plugin_teaches_the_planner_its_billing(acme):
    assert billing_for(NAME) is AcmeProvider.billing
    assert NAME in registry.on_hint() and registry.doctor_facts(NAME) is AcmeProvider.doctor
    assert NAME in registry.rented_providers()  # `down --orphans` looks there too


def test_its_estimates_charge_its_disk_and_its_spot_quotes_use_its_sigterm_window(acme, tmp_path):
    spec = load_spec(make_spec(tmp_path, model="Qwen/Qwen2.5-0.5B", disk_gb=20, spot="auto"))
    prices = AcmeProvider.price_list(os.environ["ACME_API_KEY"], [], 20, 10)
    plan = plan_job(spec, provider=NAME, prices=prices)
    opt = plan.best
    assert opt is not None and opt.provider == NAME
    storage = [p for p in opt.phases if p.name.startswith("storage")]
    assert storage and storage[0].usd == pytest.approx(20 * DISK_RUNNING / HOURS_PER_MONTH
                                                       * sum(p.hours for p in opt.phases), rel=1e-6)
    assert not any("unknown to the planner" in w for w in plan.warnings + opt.warnings)
    spot = next(o.spot for o in plan.options if o.spot is not None)
    assert spot.grace_s == SIGTERM_GRACE_S  # its own window: a save of a few seconds fits it
    # the run's own estimate of each of its offers (compute/offers.py) charges the disk too
    ranked = choose_offers(spec, acme, None, None, None, job=planned_job(spec))
    assert ranked and ranked[0].estimate is not None
    register_billing(NAME, replace(AcmeProvider.billing, disk_running_gb_month=0.0))
    cheaper = choose_offers(spec, acme, None, None, None, job=planned_job(spec))
    register_billing(NAME, AcmeProvider.billing)
    assert ranked[0].estimate.usd_total > cheaper[0].estimate.usd_total


def test_a_preempted_husk_bills_its_stopped_disk_and_a_pausing_tier_its_wait(acme, tmp_path):
    """The spot model's husk: the stopped disk at the plugin's own rate (not the running one, not
    RunPod's); a provider whose preempted instances pause (as Vast.ai's do) is waited for as long
    as its class says, and its husk bills that long."""
    spec = load_spec(make_spec(tmp_path, model="Qwen/Qwen2.5-0.5B", disk_gb=20, spot="auto"))
    plan = plan_job(spec, provider=NAME, prices=AcmeProvider.price_list(os.environ["ACME_API_KEY"], [], 20, 10))
    opt = plan.best
    job = planned_job(spec)
    stops = spot_job(job, opt, 0.1, None)
    assert stops.husk_usd_per_hour == pytest.approx(20 * DISK_STOPPED / HOURS_PER_MONTH)
    assert stops.storage_usd_per_hour == pytest.approx(20 * DISK_RUNNING / HOURS_PER_MONTH, rel=1e-6)
    register_billing(NAME, replace(AcmeProvider.billing, preempted="pauses", resume_wait_min=15.0))
    try:
        pauses = spot_job(job, opt, 0.1, None)
    finally:
        register_billing(NAME, AcmeProvider.billing)
    assert pauses.husk - stops.husk == pytest.approx(15 / 60) and pauses.wait - stops.wait == pytest.approx(15 / 60)


def test_its_spot_offers_carry_typed_fields(acme):
    offers = acme.offers(Requirements(interruptible=True))
    assert offers and all(o.interruptible and o.bid_per_gpu_hour and o.spot_tier for o in offers)


def test_doctor_checks_its_instance_by_its_own_facts(acme, runpod):
    ledger = Ledger()
    assert "never passed `lorapod doctor acme`" in (doctor_note(ledger, NAME) or "")
    report = run_doctor(acme, cheapest_offer(acme), ledger, say=lambda m: None, poll_s=0.2)
    checks = {c.name: c for c in report.checks}
    assert report.passed, [(c.name, c.evidence) for c in report.checks]
    assert "RUNPOD_API_KEY" in checks["scoped key"].evidence and checks["dead man's switch"].ok
    assert all(i.deleted_by == "pod-scoped key" for i in runpod.instances.values())
    assert doctor_note(ledger, NAME) is None  # passed: remembered like a built-in's


def test_doctor_spot_checks_its_bid_and_only_the_spot_checks_its_class_names(acme, runpod):
    """Its ``spot_checks`` are ("bid",): the bid is checked and required; RunPod's "sigterm path"
    (its own init as PID 1) is not asked of it."""
    report = run_doctor(acme, cheapest_offer(acme, spot=True), Ledger(), say=lambda m: None, poll_s=0.2)
    checks = {c.name: c for c in report.checks}
    assert report.passed and report.spot, [(c.name, c.ok, c.evidence) for c in report.checks]
    assert checks["bid"].ok and checks["bid"].evidence.startswith("interruptible, $")
    assert "sigterm path" not in checks
    assert all(p in runpod.spot for p in runpod.instances) and runpod.live() == []


# ----------------------------------------------------------------------------- through lorapod's CLI

def plugin_cli(runpod, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    """The plugin's console script: lorapod's CLI with acme registered, as its package installs it."""
    out = subprocess.run([sys.executable, str(PLUGIN_CLI), *args], capture_output=True, text=True,
                         env=cli_env(**acme_env(runpod), **env), timeout=timeout)
    out.stderr = " ".join(out.stderr.split())  # the console wraps long lines
    return out


def test_through_the_cli_it_plans_with_its_disk_and_spot_and_passes_doctor_spot(runpod, tmp_path):
    spec = make_spec(tmp_path, model="Qwen/Qwen2.5-0.5B", disk_gb=20, spot="auto")
    out = plugin_cli(runpod, "plan", str(spec), "--live", "--provider", NAME, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout)
    options = [o for o in plan["options"] if o["provider"] == NAME]
    assert options and all(o["provider"] == NAME for o in plan["options"])
    best = options[0]
    hours = sum(p["hours"] for p in best["phases"])
    (disk,) = [p for p in best["phases"] if p["name"].startswith("storage")]
    assert disk["usd"] == pytest.approx(20 * DISK_RUNNING / HOURS_PER_MONTH * hours, abs=2e-4)
    assert not any("unknown to the planner" in w for o in options for w in o["warnings"])
    spot = next(o["spot"] for o in options if o["spot"] is not None)
    assert spot["sigterm_grace_s"] == SIGTERM_GRACE_S and spot["save_fits"]
    assert plan["deadman"]["minutes"] > 0

    out = plugin_cli(runpod, "doctor", NAME, "--spot", "--yes", "--json", "--deadman-min", "5")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["passed"] and report["spot"], report
    names = {c["name"] for c in report["checks"]}
    assert {"bid", "scoped key", "dead man's switch", "gone"} <= names and "sigterm path" not in names
    assert runpod.live() == [] and all(p in runpod.spot for p in runpod.instances)


def test_through_the_cli_a_job_runs_on_it_and_nothing_bills_after(runpod, tmp_path, remote_root):
    spec = make_spec(tmp_path, max_steps=6, every=3, max_usd=1.0)
    out = plugin_cli(runpod, "run", str(spec), "--on", NAME, "--json", "--python", sys.executable, "--deps", "none",
                     "--poll-s", "0.2", "--pull-every-s", "0.3", "--ready-deadline-s", "60",
                     "--watchdog-poll-s", "0.2", LORAPOD_JOB_COMMAND=fake_command_template(0.1))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["state"] == "done" and summary["last_step"] == 6, summary
    assert "dead man's switch disarmed" in out.stderr  # its start command carried the switch
    (pod,) = runpod.instances.values()
    assert pod.deleted and pod.deleted_by == "account key"  # the controller's own teardown
    (row,) = Ledger().instances()
    assert row.provider == NAME and row.state == "destroyed"
    assert runpod.live() == [] and runpod.running_processes() == []
