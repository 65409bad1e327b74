"""``bench/gpu_check.py --smoke``: the first-contact GPU check's own code, end to end on a CPU with tiny
shapes (so CI keeps the script that will meet the first GPU working): every check reports, none
fails, and the JSON is there. CI runs it again under the lent GPU's transformers 5.17 and
huggingface_hub 1.33 (tools/torch_versions.sh)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench():
    sys.path.insert(0, str(BENCH))  # gpu_check reuses image_gpu.py and llm_throughput.py
    spec = importlib.util.spec_from_file_location("gpu_check_bench", BENCH / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_smoke_runs_every_check_and_writes_json(tmp_path, capsys):
    bench = _bench()
    report = bench.main(["--smoke", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(saved["checks"]) == set(bench.CHECKS) == {
        "env", "peak", "attention", "packed_attention", "flex", "llm_lora", "trl_varlen", "qlora", "sdxl", "dit",
        "wan_blockswap", "oom"}
    # the result folder gets the JSON only: work files (models, run folders) went elsewhere (review §3)
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]
    failed = {name: rec["error"] for name, rec in saved["checks"].items() if "error" in rec}
    assert not failed
    checks = report["checks"]
    assert checks["qlora"]["skipped"].startswith("QLoRA and 8-bit AdamW need CUDA")
    # the planner's figures sit beside the measured ones
    assert "peak_allocated_gib" in checks["llm_lora"]["seq2048"]["planner"]
    assert checks["llm_lora"]["seq2048"]["steps"] == 2
    assert "it_s" in checks["sdxl"]["planner"]
    wan = checks["wan_blockswap"]
    assert wan["left_on_gpu_after_backward_gib"] == 0 and wan["moves"] > 0
    assert wan["with_swap"]["planner"]["peak_allocated_gib"] < wan["without_swap"]["planner"]["peak_allocated_gib"]
    assert {r["gradient_checkpointing"] for r in checks["dit"]["runs"]} == {True, False}
    oom = checks["oom"]
    assert oom["raised"] == "OutOfMemory" and oom["step"] == 1 and oom["checkpoint"].endswith("step-1")
    assert "--set" in oom["hint"]
    # the hint, done: the run resumes from its checkpoint with the --set changes and finishes
    assert oom["resume"]["last_step"] == oom["resume"]["max_steps"] == 3 and oom["resume"]["sets"]
    # MFU beside tokens/s, over the measured matmul peak; TRL (sdpa on a CPU) as the standard
    row = checks["llm_lora"]["seq2048"]
    assert row["mfu"] > 0 and row["peak_tflops"] == round(checks["peak"]["tflops"], 1)
    assert checks["trl_varlen"]["attention"] == "sdpa" and checks["trl_varlen"]["lorapod_over_trl"] > 0
    assert {r["path"] for r in checks["packed_attention"]["runs"]} == {"lorapod", "varlen_attn"}
    assert [r["tokens"] for r in checks["flex"]["runs"]] == [64, 72]
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'gpu_check.json'}" in out
