"""The planner learns from the user's own runs in the ledger, and says so."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lorapod.cli.main import build_app
from lorapod.compute.ledger import Ledger
from lorapod.plan.choose import plan_job
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SDXL = EXAMPLES / "sdxl-object-lora.yaml"


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def _finished_job(tmp_path: Path, job_id: str, gpu: str, times: list[float], mem: float, sets: tuple[str, ...] = ()):
    run = tmp_path / "runs" / job_id
    run.mkdir(parents=True)
    spec = load_spec(SDXL, list(sets))
    (run / "spec.yaml").write_text(spec.to_yaml(), encoding="utf-8")
    with open(run / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for i, t in enumerate(times, 1):
            fh.write(json.dumps({"step": i, "loss": 0.1, "step_time_s": t, "mem_gb": mem + i * 0.01}) + "\n")
    ledger = Ledger()
    ledger.job_started(job_id, str(run), "runpod", "runpod", str(SDXL), None, None)
    ledger.instance_creating("runpod", job_id, 0.74, gpu_name=f"NVIDIA GeForce {gpu}")
    ledger.job_ended(job_id, "done", "finished")
    ledger.close()
    return run


def test_a_matching_run_on_the_same_gpu_sets_the_speed(tmp_path):
    times = [9.0, 9.0, 9.0, 0.70, 0.72, 0.74, 0.71, 0.90]  # three warm-up steps are skipped
    run = _finished_job(tmp_path, "mine-1", "RTX 4090", times, 9.5)
    plan = plan_job(load_spec(SDXL), images=25, gpu="RTX 4090")
    o = plan.options[0]
    assert o.speed.basis == "your runs"
    assert o.speed.seconds_per_step == pytest.approx(statistics.median(times[3:]))
    assert [r.job_id for r in o.speed.runs] == ["mine-1"]
    assert any("speed from your 1 run(s)" in w and "mine-1" in w for w in o.warnings)
    assert o.to_json()["speed"]["runs"] == ["mine-1"]
    # the ledger remembers the measurement even when the run folder is gone
    (m,) = Ledger().measurements()
    assert m["gpu_name"] == "RTX 4090" and m["peak_gb"] == pytest.approx(9.5 + 8 * 0.01)
    import shutil

    shutil.rmtree(run)
    again = plan_job(load_spec(SDXL), images=25, gpu="RTX 4090").options[0].speed
    assert again.basis == "your runs" and again.seconds_per_step == pytest.approx(o.speed.seconds_per_step)


def test_another_gpu_is_carried_over_by_the_models_ratio(tmp_path):
    _finished_job(tmp_path, "mine-2", "RTX 4090", [1.0] * 3 + [0.70] * 5, 9.0)
    model_only = plan_job(load_spec(SDXL), images=25, gpu="RTX 3090")
    ref = plan_job(load_spec(SDXL, []), images=25, gpu="RTX 4090")
    assert ref.options[0].speed.basis == "your runs"
    # a fresh model estimate for the 4090 (without the ledger) gives the ratio
    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.speed import step_speed

    job = ref.job
    r4090 = step_speed(job.model, job.settings, find_gpu("RTX 4090"), learn=False).seconds_per_step
    r3090 = step_speed(job.model, job.settings, find_gpu("RTX 3090"), learn=False).seconds_per_step
    o = model_only.options[0]
    assert o.speed.basis == "your runs"
    assert o.speed.seconds_per_step == pytest.approx(0.70 * r3090 / r4090, rel=1e-6)
    assert not o.speed.runs[0].same_gpu


def test_runs_with_other_settings_do_not_match(tmp_path):
    _finished_job(tmp_path, "rank-32", "RTX 4090", [0.5] * 8, 9.0, ("method.r=32",))
    plan = plan_job(load_spec(SDXL), images=25, gpu="RTX 4090")
    assert plan.options[0].speed.basis == "model"


def test_explain_lists_the_runs_and_the_published_points(tmp_path):
    _finished_job(tmp_path, "mine-3", "RTX 4090", [0.8] * 8, 9.0)
    r = CliRunner().invoke(build_app(), ["plan", str(SDXL), "--images", "25", "--gpu", "RTX 4090", "--explain"])
    assert r.exit_code == 0, r.output
    assert "mine-3" in r.output and "same GPU" in r.output
    assert "Published speed points nearest this job" in r.output
    assert "https://github.com/bmaltais/kohya_ss/issues/1288" in r.output
    j = CliRunner().invoke(build_app(), ["plan", str(SDXL), "--images", "25", "--gpu", "RTX 4090", "--json", "--explain"])
    out = json.loads(j.stdout)
    assert out["explain"]["basis"] == "your runs"
    assert out["explain"]["your_runs"][0]["job_id"] == "mine-3"
    assert {p["source"] for p in out["explain"]["speed_points"]} >= {"kohya-ss-1288"}


def test_every_estimate_prints_a_likely_range():
    r = CliRunner().invoke(build_app(), ["plan", str(SDXL), "--images", "25", "--gpu", "RTX 4090", "--provider", "vast"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("#1 RTX 4090:"))
    assert "likely" in line and "(model)" in line and "VRAM likely" in line
