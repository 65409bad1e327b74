"""``bench/image_gpu.py --smoke``: the GPU bench's own code path on a CPU in seconds (so CI runs it),
with the planner's it/s and allocated peak printed beside the measured figures (G25)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "image_gpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("image_gpu_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("fp8", [False, True])
def test_image_bench_smoke_prints_the_planner_beside_the_measurement(capsys, fp8):
    from lorapod.catalog.gpus import find_gpu
    from lorapod.catalog.models import find_model
    from lorapod.plan.estimate import step_speed
    from lorapod.plan.vram import Settings, estimate

    row = _bench().main(["--smoke", "--steps", "2", "--gpu", "RTX 4090", *(["--fp8"] if fp8 else [])])
    out = capsys.readouterr().out
    assert "planner it/s" in out and "planner peak allocated" in out
    s = Settings(base_dtype="fp8" if fp8 else "bf16", r=16, targets="all-linear", optimizer="adamw",
                 gradient_checkpointing=True, batch=1, resolution=1024, framework="lorapod")
    est = estimate(find_model("sdxl"), s)
    want = step_speed(find_model("sdxl"), s, find_gpu("RTX 4090"), est, learn=False).it_per_s
    assert row["planner"]["gpu"] == "RTX 4090"
    assert row["planner"]["it_s"] == pytest.approx(want)
    assert row["planner"]["peak_allocated_gib"] == est.read_as("allocated") < est.peak_gb
    assert row["it_s"] > 0 and row["peak_allocated_gib"] is None  # no GPU: no allocated peak to read
    assert f"{want:.2f}" in out and f"{est.read_as('allocated'):.1f} GiB" in out
