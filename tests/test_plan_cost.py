"""The worked costs of the guides, reproduced to the cent, and the planner's own estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.plan.choose import plan_job
from lorapod.plan.cost import cents, left_running_usd
from lorapod.plan.storage import advise
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GUIDE_PHASES = [
    "compute.phases.boot_min=10",
    "compute.phases.prep_min=10",
    "compute.phases.train_min=30",
    "compute.phases.review_min=15",
]


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.delenv("VAST_API_KEY", raising=False)


def _option(plan, provider, gpu, tier):
    return next(o for o in plan.options if (o.provider, o.gpu, o.tier) == (provider, gpu, tier))


def test_sdxl_recipe_is_2000_steps():
    plan = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25)
    assert plan.job.steps == 25 * 10 * 8 // 1 == 2000


def test_steps_count_the_images_in_the_data_folder(tmp_path):
    """Every image that decodes, subfolders included (the data check's own scan); a file named
    .jpg that is not an image is not trained on, so it is not counted (issue 48, F14)."""
    Image = pytest.importorskip("PIL.Image")
    data = tmp_path / "mug"
    (data / "sub").mkdir(parents=True)
    for i in range(7):
        Image.new("RGB", (64, 64), (30 * i, 90, 120)).save(data / f"p{i}.jpg")
        (data / f"p{i}.txt").write_text("zxq_mug")
    Image.new("RGB", (64, 64), (9, 9, 9)).save(data / "sub" / "q.png")
    (data / "fake.jpg").write_bytes(b"x" * 1000)
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", [f"data.path={data}", "train.micro_batch_size=2"])
    plan = plan_job(spec)
    assert plan.job.images == 8
    assert plan.job.steps == (8 * 10 // 2) * 8  # images x repeats / batch, per epoch, x epochs
    assert not any("assumed" in w for w in plan.warnings)


def test_guide_phase_durations_reproduce_the_guide_to_the_cent():
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", GUIDE_PHASES)
    plan = plan_job(spec, images=25, gpu="RTX 4090")
    vast = _option(plan, "vast", "RTX 4090", "from")
    runpod = _option(plan, "runpod", "RTX 4090", "price_page")
    assert vast.hours_total == pytest.approx(65 / 60)
    assert cents(vast.usd_compute) == cents(0.34)
    assert cents(runpod.usd_compute) == cents(0.80)
    disk = [p for p in runpod.phases if p.name.startswith("storage")]
    assert len(disk) == 1 and 0 < disk[0].usd < 0.01
    assert disk[0].usd == pytest.approx(50 * 0.10 / 730 * 65 / 60)


def test_flux2_klein_one_and_a_half_hours():
    spec = load_spec(
        EXAMPLES / "flux2-klein-lora.yaml",
        ["compute.phases.boot_min=10", "compute.phases.prep_min=5", "compute.phases.train_min=60",
         "compute.phases.review_min=15"],
    )
    plan = plan_job(spec, images=20, gpu="RTX 4090")
    assert plan.job.steps == 1800
    assert cents(_option(plan, "runpod", "RTX 4090", "price_page").usd_compute) == cents(1.11)
    assert cents(_option(plan, "vast", "RTX 4090", "from").usd_compute) == cents(0.47)


def test_an_instance_left_running_overnight():
    assert cents(left_running_usd(12, 0.74)) == cents(8.88)
    plan = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25, gpu="RTX 4090", provider="runpod")
    plan_at_074 = [o for o in plan.options if o.usd_per_hour == 0.74]
    assert plan_at_074
    assert any("12 h" in w for w in plan.warnings)


def test_storage_rates_for_260_gb():
    adv = advise(260, 8, 3)
    assert adv.container_running_month == pytest.approx(26.0)
    assert adv.volume_stopped_month == pytest.approx(52.0)
    assert round(adv.network_volume_month) == 18
    by_kind = {o.kind: o for o in adv.options}
    # 24 h of use a month: the volume disk pays the stopped rate for the other 706 h.
    assert by_kind["volume disk"].usd_per_month == pytest.approx(260 * (0.10 * 24 + 0.20 * 706) / 730)
    assert adv.recommended == min(adv.options, key=lambda o: o.usd_per_month).kind


def test_storage_network_volume_wins_when_used_daily():
    adv = advise(260, 60, 3)
    assert adv.recommended == "network volume"


def test_options_are_ranked_by_dollars_per_job_and_hours():
    """$ per job + compute.hour_worth_usd x hours (issue 48, F22); at 0, by dollars alone."""
    plan = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25)
    worth = [o.usd_total + o.hours_total for o in plan.options]
    assert worth == sorted(worth)
    dollars = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml", ["compute.hour_worth_usd=0"]), images=25)
    totals = [o.usd_total for o in dollars.options]
    assert totals == sorted(totals)
    assert {o.provider for o in plan.options} == {"runpod", "vast"}
    assert all(o.fits for o in plan.options)


def test_phase_overrides_replace_single_estimates():
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", ["compute.phases.download_min=7", "compute.phases.sampling_min=3"])
    plan = plan_job(spec, images=25, gpu="RTX 4090", provider="vast")
    phases = {p.name: p.hours * 60 for p in plan.options[0].phases}
    assert phases["download base model"] == pytest.approx(7)
    assert phases["sampling"] == pytest.approx(3)
    assert phases["boot + install"] == pytest.approx(10)


def test_record_for_the_run_folder_is_json():
    import json

    plan = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25)
    rec = json.loads(json.dumps(plan.to_record()))
    assert rec["job"]["steps"] == 2000 and rec["job"]["model"] == "SDXL base 1.0"
    assert rec["options"][0] == plan.options[0].to_json()
    assert rec["snapshot_date"] == "2026-09-15"


def test_budget_caps_are_flagged():
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", ["compute.max_usd=0.5", "compute.max_hours=0.95"])
    plan = plan_job(spec, images=25, gpu="RTX 4090")
    by_tier = {o.tier: o for o in plan.options}
    assert any("over budget" in w for w in by_tier["price_page"].warnings)  # $0.68 at $0.74/h
    assert not any("over budget" in w for w in by_tier["from"].warnings)  # $0.28 on Vast.ai
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", ["compute.max_hours=0.5"])
    assert all(any("over time" in w for w in o.warnings) for o in plan_job(spec, images=25).options)


def test_cache_phase_scales_between_gpus_by_the_fitted_rate_not_the_guide_class():
    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.cost import CACHE_SECONDS_PER_IMAGE_4090, CACHE_STARTUP_MIN, phase_minutes
    from lorapod.plan.estimate import matmul_rate, step_speed
    from lorapod.plan.job import build_job

    job = build_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25)
    a100, ref = find_gpu("A100 80GB"), find_gpu("RTX 4090")

    def cache(gpu):
        return dict(phase_minutes(job, gpu, step_speed(job.model, job.settings, gpu)))["cache"]

    assert cache(ref) == pytest.approx(CACHE_STARTUP_MIN + 25 * CACHE_SECONDS_PER_IMAGE_4090 / 60)
    rate = matmul_rate(job.model, job.settings, ref) / matmul_rate(job.model, job.settings, a100)
    assert (cache(a100) - CACHE_STARTUP_MIN) * 60 / 25 == pytest.approx(rate)
