"""``bench/llm_packing.py --smoke``: the packing bench's code path on a CPU in seconds (so CI runs
it): both paths run on the same rows and print the same loss."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "llm_packing.py"


def _bench():
    spec = importlib.util.spec_from_file_location("llm_packing_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_packing_bench_smoke_runs_both_paths_to_the_same_loss(capsys):
    rows = _bench().main(["--smoke", "--lengths", "256"])
    out = capsys.readouterr().out
    assert "| 256 | mask |" in out and "| 256 | padding-free |" in out and "same loss" in out
    assert len(rows) == 1
    row = rows[0]
    assert abs(row["mask"]["loss"] - row["padding-free"]["loss"]) < 1e-4
    assert row["mask"]["tok_s"] > 0 and row["padding-free"]["tok_s"] > 0
    assert "| yes |" in out
