"""``bench/llm_throughput.py``'s own arithmetic (the GPU review's G5): warm-up steps are left out of
the timing, and the planner's prediction for each variant's job sits beside the measurement."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .llm_fixtures import make_model_dir

BENCH = Path(__file__).resolve().parents[1] / "bench" / "llm_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("llm_throughput_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_warm_up_steps_are_not_timed():
    bench = _bench()
    # 4 steps, 4,000 real tokens: 1,000 a step; the first two (cuBLAS setup, allocator growth) are slow
    tps, kept = bench.steady({"step_times": [5.0, 2.0, 0.5, 0.5], "real_tokens": 4000}, warmup=2)
    assert kept == 2 and tps == pytest.approx(2000.0)
    tps, kept = bench.steady({"step_times": [5.0, 2.0], "real_tokens": 2000}, warmup=2)  # too few: all of them
    assert kept == 2 and tps == pytest.approx(1000 / 3.5)


def test_the_planner_column_is_the_planners_estimate_for_that_job(tmp_path):
    from lorapod.catalog.gpus import find_gpu
    from lorapod.catalog.models import find_model
    from lorapod.plan.estimate import step_speed
    from lorapod.plan.vram import Settings, estimate

    bench = _bench()
    model_dir = make_model_dir(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / "model").symlink_to(model_dir)
    got = bench.planned(root, "trl-sft-packed", 4, 1024, "H100 SXM")
    model = find_model(str(model_dir), "llm")
    s = Settings(base_dtype="bf16", r=16, targets="all-linear", optimizer="adamw", gradient_checkpointing=False,
                 batch=4, seq_len=1024, framework="hf")
    est = estimate(model, s)
    assert got["gpu"] == "H100 SXM" and got["peak_allocated_gib"] == est.read_as("allocated")
    want = 4 * 1024 / step_speed(model, s, find_gpu("H100 SXM"), est, learn=False).seconds_per_step
    assert got["tokens_per_s"] == pytest.approx(want)
    assert "error" in bench.planned(root, "lorapod", 4, 1024, "no such gpu")  # said, not raised
