"""Measured setup phases feed the planner's "boot + install" per provider."""

from __future__ import annotations

import json

from lorapod.plan.choose import plan_job
from lorapod.plan.cost import BOOT_MIN
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger
from lorapod.store.phases import job_phases, measured_boot_min

from .remote_helpers import REPO


def record(ledger: Ledger, job: str, provider: str, **seconds: float) -> None:
    for name, s in seconds.items():
        ledger.event("phase", json.dumps({"phase": name.replace("_", " "), "s": s, "note": "", "provider": provider}),
                     job_id=job)


def boot_hours(plan, provider: str) -> set[float]:
    return {round(o.phases[0].hours * 60, 6) for o in plan.options if o.provider == provider}


def test_plan_uses_the_ledgers_median_boot_install_per_provider():
    spec = load_spec(REPO / "examples" / "sdxl-object-lora.yaml")
    assert measured_boot_min("runpod") is None  # no ledger yet: plan creates none
    before = plan_job(spec, images=25)
    assert boot_hours(before, "runpod") == {BOOT_MIN}
    ledger = Ledger()
    record(ledger, "j1", "runpod", boot=60, ssh_ready=10, environment=50, first_step=300)  # 2 min
    record(ledger, "j2", "runpod", boot=120, ssh_ready=30, environment=90)  # 4 min
    record(ledger, "j3", "runpod", boot=100, ssh_ready=20, environment=60)  # 3 min
    record(ledger, "j4", "runpod", boot=999)  # incomplete: not counted
    record(ledger, "j5", "ssh", boot=1, ssh_ready=1, environment=1)
    assert measured_boot_min("runpod") == (3.0, 3)
    assert job_phases(ledger, "j1") == {"boot": 60, "ssh ready": 10, "environment": 50, "first step": 300}
    after = plan_job(spec, images=25)
    assert boot_hours(after, "runpod") == {3.0}
    assert boot_hours(after, "vast") == {BOOT_MIN}
    runpod_best = next(o for o in after.options if o.provider == "runpod")
    assert any("3.0 min, the median your ledger measured over 3 job(s)" in w for w in runpod_best.warnings)
    # The spec's own figure still wins.
    fixed = load_spec(REPO / "examples" / "sdxl-object-lora.yaml", ["compute.phases.boot_min=7"])
    assert boot_hours(plan_job(fixed, images=25), "runpod") == {7.0}
