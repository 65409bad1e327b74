"""lorapod's bridge and run-folder mirror against what the trainers really printed and wrote.

The fixtures under tests/recorded/ come from the trainers' own code, not from lorapod:
- axolotl/: a real axolotl 0.19.0 run on CPU through lorapod's job wrapper
  (tools/upstream/cpu_run.py axolotl --record): its output as printed (bytes, ``\\r`` included),
  for two steps to the end, four steps stopped by STOP after the first step, and the resume of
  that stop; the files it wrote (files.json).
- ai-toolkit/loss_log.sql: a database ai-toolkit's own UILogger wrote (tools/upstream_check.py
  record); tests/test_trainers_bridge.py reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from lorapod.trainers import get
from lorapod.trainers.base import Layout
from lorapod.trainers.bridge import HFTrainerLogs
from lorapod.trainers.runner import Mirror, trainer_reason

REPO = Path(__file__).resolve().parents[1]
AXOLOTL = REPO / "tests" / "recorded" / "axolotl"
FILES = json.loads((AXOLOTL / "files.json").read_text())


def log(name: str) -> str:
    return (AXOLOTL / f"{name}.log").read_bytes().decode("utf-8", errors="replace")


def bridged(text: str, chunk: int = 4096) -> list[dict]:
    bridge = HFTrainerLogs()
    recs = []
    for i in range(0, len(text), chunk):  # the wrapper reads the output in chunks of any size
        recs += bridge.feed(text[i:i + chunk])
    return recs + bridge.flush()


def test_axolotl_real_output_becomes_one_record_per_trainer_step():
    """axolotl prints described bars ("Loading weights: ... 21/21") before the Trainer's own; the
    step comes from the Trainer's bar only, so the records are steps 1 and 2, as the run wrote."""
    recs = bridged(log("two-steps"))
    assert [r["step"] for r in recs] == [1, 2]
    assert recs == [{k: v for k, v in m.items()} for m in FILES["metrics"]]
    assert all(isinstance(r["loss"], float) and r["loss"] > 0 for r in recs)
    assert bridged(log("two-steps"), chunk=7) == recs


def test_axolotl_stop_and_resume_continue_one_curve():
    stopped, resumed = bridged(log("stop")), bridged(log("resume"))
    assert [r["step"] for r in stopped] == [1, 2]  # STOP after step 1: its trigger saved step 2
    assert "lorapod trainer-run: resuming axolotl from step-2" in log("resume")
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["step"] for r in FILES["stop_then_resume"]["metrics"]] == [1, 2, 3, 4]
    assert "checkpoints/step-4/" in FILES["stop_then_resume"]["run"]


def test_axolotl_real_outputs_land_in_the_run_folder(tmp_path):
    """The files axolotl wrote, recreated by name, mirrored as lorapod's run folder holds them."""
    out = tmp_path / "trainer" / "out"
    for rel in FILES["trainer_out"]:
        p = out / rel
        if rel.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rel.encode())
    run = tmp_path / "run"
    mirror = Mirror(get("axolotl"), Layout(str(tmp_path)), "chat", run, keep_last=2)
    mirror.sync()
    time.sleep(0.01)
    mirror.sync()
    mirror.sync(final=True)
    got = sorted(str(p.relative_to(run)) + ("/" if p.is_dir() else "") for p in run.rglob("*"))
    want = [r for r in FILES["run"] if not r.startswith(("metrics.jsonl", "samples/"))]
    assert got == want


def test_no_exception_line_in_a_clean_run():
    lines = log("two-steps").replace("\r", "\n").splitlines()
    assert trainer_reason(lines) is None


AXOLOTL_PYTHON = os.environ.get("LORAPOD_AXOLOTL_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not AXOLOTL_PYTHON, reason="set LORAPOD_AXOLOTL_PYTHON to a Python with axolotl's training "
                    "path (.ci/run builds one from tools/upstream/axolotl-cpu.txt)")
def test_axolotl_trains_two_real_steps_through_the_wrapper():
    """Real axolotl, two steps on a tiny random Llama, through run_trainer (25-60 s on two cores)."""
    proc = subprocess.run([AXOLOTL_PYTHON, str(REPO / "tools" / "upstream" / "cpu_run.py"), "axolotl", "--quick"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "two-steps: exit 0" in proc.stdout and "lorapod trainer-run: done" in proc.stdout
