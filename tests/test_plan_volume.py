"""``lorapod plan`` prices a RunPod network volume against re-downloading the base model each
session, and with ``compute.volume`` ranks only what such a run can rent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapod.plan.choose import plan_job
from lorapod.plan.volume import SECURE_TIERS, volume_advice, with_volume
from lorapod.spec import load_spec

from .cli_helpers import run_cli

FLUX = str(Path(__file__).resolve().parents[1] / "examples" / "flux2-klein-lora.yaml")


def test_volume_priced_against_the_download_phase():
    plan = plan_job(load_spec(FLUX), images=25)
    adv = volume_advice(plan, sessions_per_month=4)
    best = next(o for o in plan.options if o.provider == "runpod")
    dl = next(p for p in best.phases if p.name == "download base model")
    assert adv.usd_per_month == pytest.approx(adv.size_gb * 0.07, abs=0.01)
    assert adv.redownload_usd == pytest.approx(dl.hours * best.usd_per_hour)
    assert adv.recommended is False  # 4 sessions of a few minutes' download cost cents
    many = volume_advice(plan, sessions_per_month=adv.breakeven_sessions + 1)
    assert many.recommended is True and "recommended: add compute.volume" in many.lines()[0]


def test_spec_with_a_volume_ranks_only_runpod_secure_cloud():
    plan = with_volume(plan_job(load_spec(FLUX, ["compute.volume=models"]), images=25))
    assert plan.options and {(o.provider, o.tier in SECURE_TIERS) for o in plan.options} == {("runpod", True)}
    assert any("compute.volume models" in w for w in plan.warnings)


def test_cli_says_it(capsys):
    code, out, err = run_cli(["plan", FLUX, "--images", "25", "--json", "--set", "compute.volume=models",
                              "--sessions-per-month", "100"], capsys)
    assert code == 0, err
    vol = json.loads(out)["volume"]["runpod"]
    assert vol["name"] == "models" and vol["sessions_per_month"] == 100
    code, out, err = run_cli(["plan", FLUX, "--images", "25"], capsys)
    assert code == 0, err
    assert "network volume" in out and "Vast.ai volumes live on one host" in out
