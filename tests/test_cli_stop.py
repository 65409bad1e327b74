"""``lorapod stop JOB``: stop at the next save, as a library call (``compute/jobs.stop_job``,
``RunDir.request_stop``) and a command (issue 34 item 3). Before, only the dashboard could."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lorapod.compute.jobs import stop_job
from lorapod.home import lorapod_home
from lorapod.rundir import METRICS, STOP, RunDir, checkpoint_name
from lorapod.store.ledger import Ledger

from .cli_helpers import run_cli
from .llm_fixtures import make_model_dir, spec_dict, write_data
from .remote_helpers import FAKE_TRAINER, make_spec

ROOT = Path(__file__).resolve().parents[1]


def wait_for(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if got := check():
            return got
        time.sleep(0.1)
    raise AssertionError(f"no {what} after {timeout} s")


def test_stop_a_local_run_saves_at_the_next_step_and_ends(tmp_path, capsys):
    model_dir = make_model_dir(tmp_path)
    tr, va = write_data(tmp_path)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec_dict(model_dir, tr, va, tmp_path / "runs")))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lorapod", "train", str(spec_file), "--run-dir", str(run),
                             "--set", "train.max_steps=100000", "--set", "train.epochs=100000",
                             "--set", "save.every_steps=100000", "--set", "eval.every_steps=100000"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: RunDir(run).writer(), 120, "writer's lock")  # it writes the folder: ask it to stop
        code, _, err = run_cli(["stop", str(run), "--reason", "enough for the test"], capsys)
        assert code == 0, err
        said = " ".join(err.split())  # as rich wrapped it
        assert "saves a checkpoint at its next step" in said and f"pid {proc.pid}" in said
        assert (run / STOP).read_text() == "enough for the test\n"
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    step = max(r["step"] for r in map(json.loads, (run / METRICS).read_text().splitlines()))
    assert f"stopped on request at step {step}" in out
    assert (run / "checkpoints" / checkpoint_name(step)).is_dir()
    # nothing writes it now: stopping again is refused, and no STOP is left for the resume to find
    (run / STOP).unlink()
    code, _, err = run_cli(["stop", str(run)], capsys)
    assert code == 1 and "no process is writing" in " ".join(err.split()) and "Traceback" not in err
    assert not (run / STOP).exists()


def test_stop_a_remote_job_writes_stop_on_its_instance(tmp_path, capsys):
    """A job on the local provider (its "instance" is a work folder under LORAPOD_HOME), the
    stand-in trainer running there: ``lorapod stop JOB`` reaches it through the ledger like any
    provider's instance, and the trainer saves and exits."""
    ledger = Ledger()
    job_id = "remote-20261202-120000-0001"
    work = lorapod_home() / "local" / ".lorapod-work" / job_id
    (work / "run").mkdir(parents=True)
    spec = make_spec(tmp_path, max_steps=100000)
    ledger.job_started(job_id, str(tmp_path / "runs" / job_id), "local", "local", str(spec), None, None)
    ledger.job_update(job_id, state="running")
    iid = ledger.instance_creating("local", job_id, 0.0)
    ledger.instance_created(iid, "localhost-0")
    ledger.instance_ready(iid, "localhost", 0, "local")
    proc = subprocess.Popen([sys.executable, str(FAKE_TRAINER), str(spec), "--run-dir", str(work / "run"),
                             "--step-s", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (work / "run" / METRICS).is_file(), 30, "first step")
        code, _, err = run_cli(["stop", job_id], capsys)
        assert code == 0, err
        assert "STOP written on localhost-0" in " ".join(err.split()) and (work / "run" / STOP).is_file()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert any("STOP written on the instance" in e["message"] for e in ledger.events(job_id))
    assert RunDir(work / "run").checkpoints_by_step()  # it saved before it ended
    # once its instance is gone and no controller follows the job there is nothing to ask: a clear
    # error, not a traceback (a controller that follows it, in a spot recovery, takes the request:
    # tests/test_compute_users_word.py)
    ledger.instance_destroyed(iid)
    ledger.job_ended(job_id, "stopped", "stopped at step 3")
    code, _, err = run_cli(["stop", job_id], capsys)
    assert code == 1 and "has no live instance to stop" in " ".join(err.split()) and "Traceback" not in err
    assert stop_job.__doc__ and "next save" in stop_job.__doc__
