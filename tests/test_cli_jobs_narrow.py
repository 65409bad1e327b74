"""`lorapod ps` piped or at 80 columns: the job id people copy into `down`/`logs`/`pull` stays whole."""

from __future__ import annotations

import json
import subprocess

import pytest

from lorapod.rundir import new_job_id
from lorapod.store.ledger import Ledger

from .remote_helpers import cli_argv, cli_env


@pytest.fixture
def home(tmp_path):
    """A ledger with two jobs, written directly: one whose destroy was never confirmed (it may
    still bill), one on an SSH host, long id and long provider id, cleanly destroyed."""
    ledger = Ledger(tmp_path / "ledger.db")
    lost = new_job_id("demo")
    ledger.job_started(lost, str(tmp_path / "runs" / lost), "runpod", None, None, 1.0, 1.0)
    iid = ledger.instance_creating("runpod", lost, 0.44, gpu_name="NVIDIA GeForce RTX 4090")
    ledger.instance_created(iid, "x7k2p9q4r1m3")
    ledger.instance_destroying(iid)
    ledger.job_update(lost, last_step=37)
    ledger.job_ended(lost, "failed", "destroy failed")
    long = new_job_id("sdxl-object-lora-with-a-rather-long-name")
    ledger.job_started(long, str(tmp_path / "runs" / long), "ssh", "local@localhost:2222", None, None, None)
    iid2 = ledger.instance_creating("ssh", long, 0.0, gpu_name="NVIDIA H100 80GB HBM3")
    ledger.instance_created(iid2, f"root@127.0.0.1:2222/lorapod-0123abcd-{iid2[2:]}-{long}")
    ledger.instance_destroyed(iid2)
    ledger.job_update(long, last_step=120)
    ledger.job_ended(long, "done", "120 steps")
    ledger.event("phase", json.dumps({"phase": "boot", "s": 41.0, "note": "", "provider": "ssh"}), job_id=long)
    ledger.close()
    return tmp_path, lost, long


def ps(home_dir, **env: str) -> subprocess.CompletedProcess:
    e = cli_env(LORAPOD_HOME=str(home_dir), **env)
    if "COLUMNS" not in env:
        e.pop("COLUMNS", None)
    return subprocess.run([*cli_argv(), "ps"], capture_output=True, text=True, timeout=60, env=e)


@pytest.mark.parametrize("columns", ["80", None], ids=["COLUMNS=80", "piped"])
def test_ps_keeps_job_ids_whole_at_80_columns(home, columns):
    home_dir, lost, long = home
    proc = ps(home_dir, **({"COLUMNS": columns} if columns else {}))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0] == lost and long in lines  # each id alone on its line: copy it whole
    i = lines.index(lost)
    state, usd, *rest = lines[i + 1].split()  # the destroying instance still bills: $ grows
    assert state == "failed" and usd.startswith("$0.0") and rest == ["step", "37", "instance", "x7k2p9q4r1m3",
                                                                      "(destroying)"]
    assert lines[i + 2].split() == ["runpod", "NVIDIA", "GeForce", "RTX", "4090", "$0.440/h"]
    j = lines.index(long)
    assert lines[j + 1].split()[:4] == ["done", "$0.0000", "step", "120"]
    # the SSH provider id holds the job id: longer than 80 columns, it is folded, never cut
    assert lines[j + 2] == "  instance (destroyed):"
    pid = "".join(lines[j + 3:j + 5])
    assert pid.startswith("root@127.0.0.1:2222/lorapod-0123abcd-") and pid.endswith(f"-{long}")
    assert lines[j + 5].split() == ["local@localhost:2222", "NVIDIA", "H100", "80GB", "HBM3", "$0.000/h"]
    # the red line for the destroy that was never confirmed, and the setup phases, are kept
    text = " ".join(proc.stdout.split())
    assert f"job {lost}: instance x7k2p9q4r1m3 not confirmed destroyed; it may still bill. " \
           f"Run `lorapod down {lost}`" in text
    assert f"{long} setup: boot 41s" in text
    assert lines[-1].startswith("1 live instance(s)")  # the unconfirmed one


def test_ps_wide_terminal_keeps_the_table(home):
    home_dir, lost, _ = home
    proc = ps(home_dir, COLUMNS="150")
    assert proc.returncode == 0, proc.stderr
    head = next(line for line in proc.stdout.splitlines() if "$ so far" in line)
    assert [c.strip() for c in head.strip("┃│ ").split("┃")] == \
        ["job", "state", "where", "instance", "GPU", "$/h", "$ so far", "step"]
    assert any(lost in line and "x7k2p9q4r1m3 (destroying)" in line for line in proc.stdout.splitlines())


def test_ps_narrow_still_shows_an_unconfirmed_destroy_in_red(home):
    home_dir, lost, _ = home
    proc = ps(home_dir, COLUMNS="80", FORCE_COLOR="1", TERM="xterm-256color")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    red = "\x1b[1;31m"
    assert lines[0] == f"{red}{lost}\x1b[0m"
    assert lines[1].startswith(f"{red}  failed  $")
    assert not any(red in line for line in lines[3:6])  # the done job is not red
