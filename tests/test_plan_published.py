"""The VRAM estimator against every published figure in bench/plan_vram_vs_published.py.

Target: within +/-25% of each published peak, and under each published card size. The one
known miss is listed here and explained in docs/planner.md; a new miss fails this test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "plan_vram_vs_published.py"
KNOWN_MISSES = {"Qwen2.5 14B QLoRA"}


def _bench():
    spec = importlib.util.spec_from_file_location("plan_vram_vs_published", BENCH)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


BENCH_MOD = _bench()


@pytest.mark.parametrize("row", BENCH_MOD.VRAM_ROWS, ids=lambda r: r.what[:40])
def test_estimate_vs_published(row):
    if row.kind == "bound":
        assert row.estimate_gb() <= row.published_gb
    elif row.what in KNOWN_MISSES:
        assert abs(row.error()) > 0.25, "a known miss now passes: remove it from KNOWN_MISSES and the docs"
    else:
        assert abs(row.error()) <= 0.25, f"{row.what}: {row.estimate_gb():.1f} vs {row.published_gb}"


def test_speed_calibration_points():
    rows = {what: ours for what, _, ours, _ in BENCH_MOD.speed_rows()}
    assert 1.1 <= float(rows["SDXL LoRA, RTX 4090, 1024 px, batch 1, GC"].split()[0]) <= 1.4
    assert float(rows["FLUX.2 klein 4B, 1800 steps, RTX 4090"].split()[0]) < 60
    assert 2 <= float(rows["H100 vs A100, training"].rstrip("x")) <= 3
    assert 3 <= float(rows["H100 vs L40S, Wan2.1 14B"].rstrip("x")) <= 5
