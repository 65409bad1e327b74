"""`plan --trainer`: the trainer's setup time and VRAM extras change the plan, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.errors import PlanError
from lorapod.plan.choose import plan_job
from lorapod.plan.trainer_profile import profiles
from lorapod.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


def test_trainer_profile_moves_boot_and_vram():
    spec = load_spec(REPO / "examples" / "flux2-klein-lora.yaml")
    base = plan_job(spec, gpu="RTX 4090", provider="runpod", images=20)
    with_aitk = plan_job(spec, gpu="RTX 4090", provider="runpod", images=20, trainer="ai-toolkit")
    p = profiles()
    assert with_aitk.job.estimate.peak_gb == pytest.approx(base.job.estimate.peak_gb + 1.0, abs=0.01)
    boot = {o.phases[0].name: o.phases[0].hours for o in with_aitk.options}
    assert boot == {"boot + install": pytest.approx((p["boot_min"] + p["trainers"]["ai-toolkit"]["setup_min"]) / 60)}
    train = [ph.hours for ph in with_aitk.options[0].phases if ph.name == "train"]
    assert train == [ph.hours for ph in base.options[0].phases if ph.name == "train"]
    assert any("runs under ai-toolkit" in w for w in with_aitk.job.warnings)
    assert spec.compute.phases.boot_min is None  # the caller's spec is not changed


def test_a_fixed_boot_phase_wins_and_unknown_trainers_are_refused():
    spec = load_spec(REPO / "examples" / "sdxl-object-lora.yaml", ["compute.phases.boot_min=4"])
    plan = plan_job(spec, gpu="RTX 4090", provider="runpod", trainer="kohya")
    assert plan.options[0].phases[0].hours == pytest.approx(4 / 60)
    with pytest.raises(PlanError, match="no plan profile for trainer 'onetrainer'"):
        plan_job(spec, trainer="onetrainer")
