"""The planner learns from the user's own runs in the ledger, and says so."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lorapod.cli.main import build_app
from lorapod.plan.choose import plan_job
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

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
    from lorapod.plan.estimate import step_speed

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
    lines = r.output.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("#1 RTX 4090:"))
    # the entry, with the indented lines it wraps onto at 80 columns
    entry = " ".join([lines[at], *(x.strip() for x in lines[at + 1:] if x.startswith("  ")) ][:2])
    assert "likely" in lines[at] and "(model)" in entry and "VRAM likely" in entry


# ---------------------------------------------------------------- local runs, and where the GPU comes from

# Real torch.cuda.get_device_name() strings (the driver's, as nvidia-smi prints them) and what each is
# in the catalog; a variant the catalog does not hold is None, never its nearest neighbour.
DEVICE_NAMES = [
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA GeForce RTX 3090 Ti", None),
    ("NVIDIA GeForce RTX 4090 D", None),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
    ("NVIDIA GeForce RTX 4080 SUPER", None),
    ("NVIDIA RTX 6000 Ada Generation", None),
    ("NVIDIA L40", None),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA A10G", None),
    ("Tesla T4", None),
    ("Tesla V100-SXM2-16GB", None),
]


def test_the_drivers_gpu_names_map_exactly_onto_the_catalog():
    from lorapod.catalog.gpus import gpu_from_device_name

    got = [(raw, (g.name if (g := gpu_from_device_name(raw)) else None)) for raw, _ in DEVICE_NAMES]
    assert got == DEVICE_NAMES
    # spelling aside (case, '-', '_', spaces), nothing fuzzy
    assert gpu_from_device_name("nvidia a100_sxm4_80gb").name == "A100 80GB"
    assert gpu_from_device_name("RTX 4090") is None  # a provider's spelling is find_gpu's job


def _tiny_llm_spec(tmp_path: Path) -> Path:
    import yaml

    from .llm_fixtures import make_model_dir, spec_dict, write_data

    model_dir = make_model_dir(tmp_path, hidden=32, layers=1)
    tr, va = write_data(tmp_path)
    d = spec_dict(model_dir, tr, va, tmp_path / "runs", max_steps=6)
    d["eval"] = {"every_steps": None, "max_batches": 1, "at_start": False}
    d["save"] = {"every_steps": None, "every_epochs": None, "keep_last": 1}
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(d))
    return spec_file


def _train(spec_file: Path) -> Path:
    r = CliRunner().invoke(build_app(), ["train", str(spec_file), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    (run,) = (spec_file.parent / "runs").iterdir()
    return run


def test_a_local_cpu_run_is_not_recorded_and_says_why(tmp_path, caplog):
    spec_file = _tiny_llm_spec(tmp_path)
    with caplog.at_level("DEBUG", logger="lorapod.plan.learned"):
        run = _train(spec_file)
    assert json.loads((run / "device.json").read_text()) == {"type": "cpu", "name": None, "processes": 1,
                                                                "from_step": 0}
    assert [r.getMessage() for r in caplog.records if r.name == "lorapod.plan.learned"] == [
        f"run {run.name} not recorded for the planner: trained on cpu, not a GPU"]
    assert "planner: not learned from this run: trained on cpu, not a GPU" in (run / "events.log").read_text()
    assert not (tmp_path / "home" / "ledger.db").exists()  # nothing to keep: no ledger made for it


def test_a_finished_local_gpu_run_is_recorded_once_and_planned_from(tmp_path, monkeypatch):
    import lorapod.engine.device as device

    monkeypatch.setattr(device, "device_name", lambda dev: "NVIDIA GeForce RTX 4090")
    spec_file = _tiny_llm_spec(tmp_path)
    run = _train(spec_file)
    assert json.loads((run / "device.json").read_text())["name"] == "NVIDIA GeForce RTX 4090"
    times = [json.loads(x)["step_time_s"] for x in (run / "metrics.jsonl").read_text().splitlines()
             if "step_time_s" in x]
    assert len(times) == 6
    (m,) = Ledger().measurements()
    assert (m["job_id"], m["gpu_name"], m["model"], m["steps"]) == (run.name, "RTX 4090", str(tmp_path / "base"), 3)
    assert m["seconds_per_step"] == pytest.approx(statistics.median(times[3:]) / 2)  # grad_accum 2
    assert m["peak_gb"] is None  # a CPU step logs rss_gb, not GPU memory
    assert "planner: learned from this run" in (run / "events.log").read_text()

    r = CliRunner().invoke(build_app(), ["plan", str(spec_file), "--gpu", "RTX 4090", "--json"])
    assert r.exit_code == 0, r.output
    options = json.loads(r.stdout)["options"]
    assert {x["gpu"] for x in options} == {"RTX 4090"}
    assert all(x["speed"]["basis"] == "your runs" and x["speed"]["runs"] == [run.name] for x in options)
    o = options[0]
    assert o["speed"]["seconds_per_step"] == pytest.approx(m["seconds_per_step"], rel=1e-3, abs=1e-4)
    assert [x["job_id"] for x in Ledger().measurements()] == [run.name]  # the lazy reader did not add it again
    # other settings do not match it
    r = CliRunner().invoke(build_app(), ["plan", str(spec_file), "--gpu", "RTX 4090", "--json", "--set", "method.r=16"])
    assert json.loads(r.stdout)["options"][0]["speed"]["basis"] == "model"


def test_a_run_on_a_gpu_the_catalog_lacks_is_not_recorded(tmp_path, caplog):
    from lorapod.plan.learned import record_local

    run = _finished_job(tmp_path, "laptop", "RTX 4090", [0.5] * 8, 9.0)
    (run / "device.json").write_text(json.dumps({"type": "cuda", "name": "NVIDIA GeForce RTX 4090 Laptop GPU",
                                                 "processes": 1}))
    with caplog.at_level("DEBUG", logger="lorapod.plan.learned"):
        assert record_local(run) == (None, "GPU 'NVIDIA GeForce RTX 4090 Laptop GPU' is not in the catalog "
                                           "(catalog/data/gpus.yaml device_names)")
    assert "not recorded for the planner" in caplog.text
    # the engine's word beats the instance's ("NVIDIA GeForce RTX 4090" in the ledger) for a job too
    plan = plan_job(load_spec(SDXL), images=25, gpu="RTX 4090")
    assert plan.options[0].speed.basis == "model" and Ledger().measurements() == []


def test_a_job_recorded_when_it_ends_is_not_measured_again(tmp_path, monkeypatch):
    from lorapod.plan import learned

    _finished_job(tmp_path, "ended", "RTX 4090", [0.9] * 3 + [0.6] * 5, 9.0)
    ledger = Ledger()
    assert learned.record_job(ledger, "ended").gpu == "RTX 4090"
    (first,) = ledger.measurements()
    ledger.close()
    calls = []
    monkeypatch.setattr(learned, "record_job", lambda *a: calls.append(a))
    assert plan_job(load_spec(SDXL), images=25, gpu="RTX 4090").options[0].speed.basis == "your runs"
    assert calls == [] and Ledger().measurements() == [first]


def test_the_inner_train_of_a_remote_job_leaves_it_to_the_controller(tmp_path, monkeypatch):
    from lorapod.compute.remote import JOB_SH
    from lorapod.plan.learned import IN_REMOTE_JOB, record_local

    assert f"export {IN_REMOTE_JOB}=1" in JOB_SH
    run = _finished_job(tmp_path, "inner", "RTX 4090", [0.5] * 8, 9.0)
    (run / "device.json").write_text(json.dumps({"type": "cuda", "name": "NVIDIA GeForce RTX 4090", "processes": 1}))
    monkeypatch.setenv(IN_REMOTE_JOB, "1")
    assert record_local(run)[0] is None
    monkeypatch.delenv(IN_REMOTE_JOB)
    assert record_local(run)[0].gpu == "RTX 4090"


def test_a_resumed_run_counts_only_the_steps_timed_on_its_device(tmp_path):
    from lorapod.plan.learned import measure_run

    # steps 1-6 ran elsewhere (slow), the run resumed at step 6 here: 7-9 warm up again, 10-12 count
    run = _finished_job(tmp_path, "resumed", "RTX 4090", [5.0] * 6 + [2.0] * 3 + [0.4, 0.5, 0.6], 9.0)
    device = {"type": "cuda", "name": "NVIDIA GeForce RTX 4090", "processes": 1, "from_step": 6}
    (run / "device.json").write_text(json.dumps(device))
    m, _ = measure_run(run)
    assert (m.gpu, m.seconds_per_step, m.steps) == ("RTX 4090", 0.5, 3)
    assert m.peak_gb == pytest.approx(9.0 + 12 * 0.01)
    (run / "device.json").write_text(json.dumps({**device, "from_step": 0, "processes": 2}))
    assert measure_run(run) == (None, "data-parallel over 2 processes: not one GPU's step time")
