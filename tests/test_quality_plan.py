"""The quality autopilot in the plan: its scoring is a phase of the job's time and dollars, counted from
the checkpoints, the scoring prompts, the strengths and the sampling steps (plan/cost.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.catalog.gpus import find_gpu
from lorapod.plan.choose import plan_job
from lorapod.plan.cost import SAMPLE_STEP_FRACTION, phase_minutes
from lorapod.plan.estimate import step_speed
from lorapod.plan.job import build_job
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SDXL = EXAMPLES / "sdxl-object-lora.yaml"


def minutes(spec, gpu="RTX 4090"):
    job = build_job(spec, images=25)
    g = find_gpu(gpu)
    return dict(phase_minutes(job, g, step_speed(job.model, job.settings, g, job.estimate))), job


def test_scoring_is_a_phase_counted_from_checkpoints_prompts_strengths_and_steps():
    on, job = minutes(load_spec(SDXL))
    assert job.checkpoints == 4  # save.every_epochs: 2 of 8 epochs
    off, _ = minutes(load_spec(SDXL, ["quality.score=off"]))
    assert "scoring" not in off and on["train"] == off["train"]
    # 6 default prompts x (3 strengths x 4 checkpoints + the base once), 20 steps at a third of a training step
    one_strength, _ = minutes(load_spec(SDXL, ["quality.strengths=[1.0]"]))
    fewer_steps, _ = minutes(load_spec(SDXL, ["quality.steps=10"]))
    images_on, images_one = 6 * (3 * 4 + 1), 6 * (1 * 4 + 1)
    render = on["scoring"] - one_strength["scoring"]
    assert fewer_steps["scoring"] < on["scoring"]
    speed = step_speed(job.model, job.settings, find_gpu("RTX 4090"), job.estimate)
    per_image_s = 20 * speed.seconds_per_step * SAMPLE_STEP_FRACTION
    assert render == pytest.approx((images_on - images_one) * (per_image_s + 0.05) / 60, rel=1e-6)
    # a given training time is taken to include it, as it includes sampling
    assert "scoring" not in minutes(load_spec(SDXL, ["compute.phases.train_min=30"]))[0]


def test_the_plan_prices_the_scoring_and_an_llm_run_scores_too():
    plan = plan_job(load_spec(SDXL), images=25, gpu="RTX 4090")
    opt = plan.best
    scoring = next(p for p in opt.phases if p.name == "scoring")
    assert scoring.usd == pytest.approx(scoring.hours * opt.usd_per_hour)
    llm = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml"), gpu="RTX 4090")
    assert any(p.name == "scoring" and p.hours > 0 for p in llm.best.phases)
