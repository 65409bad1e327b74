"""A run folder has exactly one writer (issue 22, item 5).

A second `lorapod train --run-dir R` while the first still trains in R used to start as well:
both trained, metrics.jsonl interleaved two streams (steps 1, 2, 1, 3, 2, 4, ...) and both wrote
the checkpoints. Now the second is refused with the holder's pid, host and command; a lock left
by a process that died (SIGKILL) is taken over and said so; two `run` controllers on one job
are refused the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lorapod.rundir import LOCK_NAME, RunDir, RunDirBusy

from .remote_helpers import cli_argv, cli_env, make_spec

HOLD = ("import sys, time; from lorapod.rundir import RunDir; "
        "from pathlib import Path; RunDir(Path(sys.argv[1])).lock('lorapod train demo.yaml --run-dir R'); print('held', flush=True); time.sleep(60)")


def holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=cli_env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_with_who_holds_it(tmp_path):
    run = RunDir(tmp_path / "r")
    first = run.lock("lorapod train a.yaml")
    with pytest.raises(RunDirBusy) as exc:
        RunDir(tmp_path / "r").lock("lorapod train b.yaml")
    assert f"pid {os.getpid()}" in exc.value.message and "lorapod train a.yaml" in exc.value.message
    first.release()
    said: list[str] = []
    again = run.lock("lorapod train b.yaml", say=said.append)
    assert said == []  # released cleanly: nothing to take over
    again.release()


def test_a_lock_left_by_a_killed_process_is_taken_over_and_said(tmp_path):
    run = RunDir(tmp_path / "r")
    proc = holder(run.root)
    with pytest.raises(RunDirBusy, match=f"pid {proc.pid}"):
        run.lock()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    said: list[str] = []
    lock = run.lock("lorapod train --resume r", say=said.append)
    assert len(said) == 1 and f"left by pid {proc.pid}" in said[0] and "which is gone" in said[0]
    assert "took over" in run.events_file.read_text()
    lock.release()


def test_lorapod_train_refuses_a_run_folder_another_process_writes(tmp_path):
    spec = make_spec(tmp_path)
    run = tmp_path / "shared-run"
    proc = holder(run)
    try:
        t0 = time.monotonic()
        out = subprocess.run([*cli_argv(), "train", str(spec), "--run-dir", str(run), "--device", "cpu"],
                             capture_output=True, text=True, timeout=120, env=cli_env())
        assert time.monotonic() - t0 < 60
    finally:
        proc.kill()
        proc.wait(10)
    assert out.returncode != 0
    err = " ".join(out.stderr.split())
    assert f"already being written by pid {proc.pid}" in err and "lorapod train demo.yaml" in err, out.stderr
    assert "Traceback" not in out.stderr
    assert not (run / "metrics.jsonl").exists() and not (run / "spec.yaml").exists()


def test_a_second_controller_on_one_run_folder_is_refused(tmp_path):
    """The ledger says nobody follows the job (its controller died), but another process still
    writes its run folder: `run --resume` is refused before anything is rented."""
    from lorapod.store.ledger import Ledger

    run = tmp_path / "runs" / "job-1"
    run.mkdir(parents=True)
    spec = yaml.safe_load(make_spec(tmp_path).read_text())
    spec["data"]["path"] = str(tmp_path / "data" / "train.jsonl")
    (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    ledger = Ledger()
    ledger.job_started("job-1", str(run), "local", "local", None, None, None)
    ledger.job_ended("job-1", "interrupted", "controller killed")
    proc = holder(run)
    try:
        out = subprocess.run([*cli_argv(), "run", "--resume", "job-1", "--python", sys.executable],
                             capture_output=True, text=True, timeout=120, env=cli_env())
    finally:
        proc.kill()
        proc.wait(10)
    assert out.returncode != 0 and f"already being written by pid {proc.pid}" in " ".join(out.stderr.split())
    assert Ledger().instances() == []


def test_the_lock_never_travels_with_a_pull():
    from lorapod.compute.remote import PULL_EXCLUDES

    assert LOCK_NAME in PULL_EXCLUDES
