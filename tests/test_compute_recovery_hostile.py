"""No number a host sends decides anything in a spot recovery (issue 46, item 1): a host that writes
``total_steps: 10**12`` into its metrics, or a line nested 200,000 brackets deep, and is then really
preempted, used to end the job with a traceback (MemoryError in the tier model's list of checkpoint
intervals; RecursionError in the recovery's own parse of the pulled metrics). Through the CLI, on
the RunPod fake: the job resumes on the next pod and ends with the uninterrupted run's losses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.rundir.metrics import MetricsFeed, number, read_records
from lorapod.store.ledger import Ledger

from .remote_helpers import FAKE_TRAINER, cli_argv, cli_env, fake_command_template, make_spec
from .test_compute_spot_recovery import assert_nothing_bills, newest_live

STEPS, EVERY = 12, 2


def remote_step(remote_root: Path, limit: int = 10**6) -> int:
    """The newest real step any instance's metrics say: each line on its own (a forged step 10**12
    does not hide the real ones after it, as it would in one reader's ordered pass), steps past
    ``limit`` and lines that are not records skipped."""
    steps = [0]
    for f in remote_root.glob("*/run/metrics.jsonl"):
        for line in f.read_bytes().splitlines():
            try:
                rec = json.loads(line) if len(line) < 4096 else None
            except ValueError:
                continue
            if isinstance(rec, dict) and type(rec.get("step")) is int and 0 <= rec["step"] <= limit:
                steps.append(rec["step"])
    return max(steps)


def losses(run: Path) -> dict[int, float]:
    """Each step's loss, read as the controller reads a job of STEPS steps (a line past them dropped)."""
    return {r["step"]: r["loss"] for r in read_records(run / "metrics.jsonl", feed=MetricsFeed(ceiling=STEPS))
            if number(r.get("loss")) is not None}  # a NaN loss is no loss


@pytest.mark.parametrize("forge", ["totals", "nested", "steps"])
def test_a_hosts_forged_metrics_then_a_real_preemption_still_resume(runpod, tmp_path, remote_root, forge):
    spec_path = make_spec(tmp_path, max_steps=STEPS, every=EVERY, max_usd=1.0)
    extra = f"--chain --ckpt-mb 1 --forge-at 3 --forge {forge}"
    ref = tmp_path / "uninterrupted"  # an honest host's run: forged lines change no state
    subprocess.run([sys.executable, str(FAKE_TRAINER), str(spec_path), "--run-dir", str(ref), "--step-s", "0",
                    "--chain", "--ckpt-mb", "1"], check=True, capture_output=True, timeout=60)
    env = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                  LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url, LORAPOD_JOB_COMMAND=fake_command_template(0.25, extra))
    proc = subprocess.Popen([*cli_argv(), "run", str(spec_path), "--on", "runpod", "--spot", "always", "--json",
                             "--python", sys.executable, "--deps", "none", "--poll-s", "0.2", "--pull-every-s", "0.3",
                             "--ready-deadline-s", "30", "--watchdog-poll-s", "0.2", "--heartbeat-timeout-s", "5",
                             "--preempt-confirm-s", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while remote_step(remote_root) < 6:  # past the forged lines, a checkpoint at 4 pulled home
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        runpod.preempt(newest_live(runpod), grace_s=0.5)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["state"] == "done" and summary["spot"]["preemptions"] == 1, summary["message"]
    assert summary["last_step"] == STEPS and "1000000000000" not in summary["message"], summary  # the spec's, not the host's
    assert "Traceback" not in err and "MemoryError" not in err and "RecursionError" not in err
    assert "step 1000000000000" not in err and "PREEMPTED" in err  # the preemption said at a real step
    assert losses(Path(summary["run_dir"])) == losses(ref)  # every step once, as uninterrupted
    assert len(runpod.instances) == 2
    assert_nothing_bills(runpod, Ledger(), remote_root)
