"""`lorapod logs -f` and `lorapod pull` while a job runs, and `lorapod down JOB` mid-run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lorapod.store.ledger import Ledger

from .remote_helpers import cli_argv, cli_env, make_spec
from .test_cli_run_remote import lorapod, start_run, wait_for


def test_logs_follow_and_pull_during_a_run(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=16, every=4)
    proc = start_run(sshd, spec, 0.25, "--pull-every-s", "60")  # no periodic pulls: `lorapod pull` brings them
    try:
        wait_for(lambda: Ledger().jobs() and (Ledger().jobs()[0].last_step or 0) >= 5, 60, "step 5")
        (job,) = Ledger().jobs()
        follower = subprocess.Popen([*cli_argv(), "logs", "-f", "--raw", job.id], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=cli_env())
        pulled = lorapod("pull", job.id)
        assert pulled.returncode == 0, pulled.stderr
        assert (Path(job.run_dir) / "checkpoints" / "step-4" / "state.json").is_file()
        sshd.drop_connections()  # the follower reconnects
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        steps = [json.loads(x.split("] ", 1)[1])["step"] for x in out.splitlines() if x.startswith("[metrics.jsonl]")]
        assert steps == list(range(1, 17))  # every step once, in order, across the drop
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert Ledger().instances(live_only=True) == []


def test_down_job_mid_run_stops_everything(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=200, every=1000)
    proc = start_run(sshd, spec, 0.2, "--reconnect-s", "3")
    try:
        wait_for(lambda: Ledger().jobs() and (Ledger().jobs()[0].last_step or 0) >= 2, 60, "step 2")
        (job,) = Ledger().jobs()
        down = lorapod("down", job.id, "--json")
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout) == {"destroyed": 1}
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the controller heard it (issue 48 F4): the user's destroy, not a failure of the job
    assert proc.returncode == 0 and "destroyed at your request" in " ".join(err.split()), err
    assert "vanished" not in err
    assert list(sshd.work_root.iterdir()) == []
    ledger = Ledger()
    assert ledger.instances(live_only=True) == []
    assert ledger.job(job.id).state == "stopped"
