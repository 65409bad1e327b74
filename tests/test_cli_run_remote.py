"""`lorapod run / ps / logs / pull / down` as real subprocesses against a loopback sshd.

The controller is killed (SIGKILL) or interrupted (SIGINT) mid-run: the watchdog, or the
orderly stop, must leave no work folder on the host, a consistent ledger and intact artifacts.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.store.ledger import Ledger

from .remote_helpers import cli_argv, cli_env, fake_command_template, has_module, make_spec

FAST = ["--poll-s", "0.2", "--pull-every-s", "0.5", "--ready-deadline-s", "20", "--stop-margin-s", "1",
        "--stop-wait-s", "10", "--reconnect-s", "20", "--watchdog-poll-s", "0.3"]


def lorapod(*args: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, timeout=timeout, env=env or cli_env())


def start_run(sshd, spec: Path, step_s: float, *extra: str) -> subprocess.Popen:
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(step_s))
    return subprocess.Popen([*cli_argv(), "run", str(spec), "--on", sshd.target, "--identity", str(sshd.client_key),
                             "--python", sys.executable, *FAST, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def job_step() -> int:
    jobs = Ledger().jobs()
    return (jobs[0].last_step or 0) if jobs else 0


def checkpoints_intact(run_dir: Path) -> list[str]:
    names = []
    for ck in sorted((run_dir / "checkpoints").iterdir()):
        assert json.loads((ck / "state.json").read_text())["step"] == int(ck.name.split("-")[1])
        assert (ck / "adapter_model.bin").stat().st_size == 32 * 512
        names.append(ck.name)
    return names


def test_cli_run_over_ssh_then_ps_logs(sshd, tmp_path):
    spec = make_spec(tmp_path)
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.05))
    proc = lorapod("run", str(spec), "--on", sshd.target, "--identity", str(sshd.client_key), "--python",
                   sys.executable, "--json", *FAST, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["state"] == "done" and summary["last_step"] == 8
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    assert list(sshd.work_root.iterdir()) == []

    ps = lorapod("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    (row,) = json.loads(ps.stdout)
    assert row["state"] == "done" and row["live_instances"] == 0 and row["last_step"] == 8

    logs = lorapod("logs", summary["job_id"][:12])
    assert logs.returncode == 0, logs.stderr
    # what a renter reads: step/total, loss, $ so far of the cap (engine/progress.py), not raw JSON
    assert re.search(r"\[metrics\] step 8/8 \(100%\)  loss 0\.2500  .*\$\d+\.\d{3}", logs.stdout), logs.stdout
    assert "[job.log] done" in logs.stdout and '{"step"' not in logs.stdout
    raw = lorapod("logs", summary["job_id"][:12], "--raw")
    assert re.search(r'\[metrics\.jsonl\] \{"time": [\d.]+, "step": 8', raw.stdout), raw.stdout
    assert re.search(r"step 8/8 \(100%\)  loss 0\.2500", proc.stderr), proc.stderr  # `run` streams the same

    down = lorapod("down", "--orphans", "--json")
    assert down.returncode == 0 and json.loads(down.stdout)["destroyed"] == 0


def test_sigkilled_controller_the_watchdog_destroys(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=12, every=3)
    proc = start_run(sshd, spec, 0.25, "--heartbeat-timeout-s", "2")
    try:
        wait_for(lambda: job_step() >= 4, 60, "step 4")
        time.sleep(0.8)  # let a pull bring checkpoint step-3 home
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    ledger = Ledger()
    (job,) = ledger.jobs()
    assert ledger.instances(live_only=True), "the ledger still shows the instance as live after the kill"
    # The job finishes on its own; with the controller silent the watchdog removes the work folder.
    wait_for(lambda: not any(sshd.work_root.iterdir()), 30, "the watchdog to clean the host")
    logs = lorapod("logs", "-f", job.id, timeout=30)  # the ledger still says running: must not hang
    assert logs.returncode == 0 and "[metrics] step 1/12 (8%)  loss 2.0000" in logs.stdout, logs.stderr
    down = lorapod("down", "--orphans", "--json")
    assert down.returncode == 0, down.stderr
    counts = json.loads(down.stdout)
    assert counts["reconciled"] == 1
    assert Ledger().instances(live_only=True) == []
    run_dir = Path(job.run_dir)
    assert "step-3" in checkpoints_intact(run_dir)
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3
    ps = json.loads(lorapod("ps", "--json").stdout)
    assert ps[0]["live_instances"] == 0 and ps[0]["state"] == "stopped"


def test_ctrl_c_checkpoints_pulls_and_destroys(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=200, every=1000)
    proc = start_run(sshd, spec, 0.2)
    try:
        wait_for(lambda: job_step() >= 3, 60, "step 3")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert list(sshd.work_root.iterdir()) == []
    ledger = Ledger()
    assert ledger.instances(live_only=True) == []
    (job,) = ledger.jobs()
    assert job.state == "interrupted" and "--resume" in job.summary
    run_dir = Path(job.run_dir)
    (ck,) = checkpoints_intact(run_dir)
    assert ck == f"step-{job.last_step}"  # STOP honoured: the last step was saved and pulled
    assert (run_dir / "job.log").read_text().startswith("STOP honoured")


def test_resume_continues_from_the_pulled_checkpoint(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=200, every=1000)
    proc = start_run(sshd, spec, 0.2)
    try:
        wait_for(lambda: job_step() >= 3, 60, "step 3")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    (job,) = Ledger().jobs()
    stopped_at = job.last_step
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.01))
    proc2 = lorapod("run", "--resume", job.id, "--identity", str(sshd.client_key), "--python", sys.executable,
                    "--json", *FAST, "--set", "train.max_steps=" + str(stopped_at + 5), env=env)
    assert proc2.returncode == 0, proc2.stderr
    summary = json.loads(proc2.stdout)
    assert summary["job_id"] == job.id and summary["state"] == "done" and summary["last_step"] == stopped_at + 5
    steps = [json.loads(x)["step"] for x in (Path(job.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, stopped_at + 6))  # no step repeated, none lost
    assert len(Ledger().job_instances(job.id)) == 2 and Ledger().instances(live_only=True) == []


def test_refused_key_is_a_clear_error_and_nothing_left(sshd, tmp_path):
    from .conftest_ssh import keygen

    stranger = keygen(tmp_path / "stranger")
    spec = make_spec(tmp_path)
    proc = lorapod("run", str(spec), "--on", sshd.target, "--identity", str(stranger), "--python", sys.executable,
                   *FAST)
    assert proc.returncode == 1
    assert "refused the key" in proc.stderr and "Traceback" not in proc.stderr
    assert Ledger().instances(live_only=True) == []


def _demo_spec() -> Path | None:
    from .remote_helpers import REPO

    for p in (REPO / "examples" / "demo.yaml", REPO / "src" / "lorapod" / "examples" / "demo.yaml"):
        if p.is_file():
            return p
    return None


@pytest.mark.slow
@pytest.mark.skipif(_demo_spec() is None or not has_module("lorapod.cli.train"),
                    reason="needs the training engine (`lorapod train`) and examples/demo.yaml")
def test_real_demo_over_ssh_brings_the_adapter_home(sshd, tmp_path):
    """The real trainer on the "instance" (default job command): the adapter comes home."""
    spec = _demo_spec()
    env = cli_env()
    env.pop("LORAPOD_JOB_COMMAND", None)
    proc = subprocess.run([*cli_argv(), "run", str(spec), "--on", sshd.target, "--identity", str(sshd.client_key),
                           "--python", sys.executable, "--json", "--poll-s", "1", "--pull-every-s", "5",
                           "--set", f"output.dir={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    run_dir = Path(summary["run_dir"])
    assert summary["state"] == "done"
    assert any((run_dir / "adapter").glob("adapter_config.json"))
    assert (run_dir / "metrics.jsonl").stat().st_size > 0
    assert list(sshd.work_root.iterdir()) == [] and Ledger().instances(live_only=True) == []


def test_second_ctrl_c_skips_the_wait_but_still_destroys(sshd, tmp_path):
    spec = make_spec(tmp_path, max_steps=200, every=1000)
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.2, "--hang-at 3"))  # hangs, ignores STOP
    proc = subprocess.Popen([*cli_argv(), "run", str(spec), "--on", sshd.target, "--identity", str(sshd.client_key),
                             "--python", sys.executable, *FAST, "--stop-wait-s", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: job_step() >= 2, 60, "step 2")
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert elapsed < 20  # did not wait the 60 s stop-wait
    assert list(sshd.work_root.iterdir()) == []
    assert Ledger().instances(live_only=True) == []
