"""The user's word and the provider's word win over the controller's guesses (issue 46, items 3
and 4; issue 48 F4), each through the CLI on the RunPod fake:

* ``lorapod down JOB`` at each moment of a spot recovery (the husk's destroy answered late with
  nothing rented yet, the replacement's create in flight, the replacement booting, the
  replacement being set up, and after a ``stop`` in the same window) leaves nothing billing and
  nothing rented after it; the job ends ``stopped``, destroyed at the user's request (it used to
  rent a third instance and train on);
* ``lorapod stop JOB`` in the same window stops at the newest checkpoint home (it used to be refused:
  "has no live instance to stop");
* ``lorapod down JOB`` on a running job: the controller brings the checkpoint it had on the
  instance home and reports the end as the user's (it used to say "failed: the job's work folder
  vanished" and lose that checkpoint);
* a finished job whose instance its own watchdog destroyed while the controller was not looking
  ends ``done`` at its last step once the provider says the pod is gone, the ledger billing what
  the provider billed (it used to reconnect for 10 minutes, billing the gone pod all along);
* a preempted husk whose destroy is never confirmed exits 3 with the red line, and never claims
  that a watchdog keeps trying (a stopped husk runs none).

Every wait here is on a condition (the fake's state, the ledger, a file on the instance), bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lorapod.rundir.layout import checkpoints_by_step
from lorapod.store.ledger import Ledger

from .fake_trainer import whole
from .fakes.base import Fault
from .remote_helpers import cli_argv, cli_env, fake_command_template, make_spec
from .test_compute_recovery_hostile import remote_step
from .test_compute_spot_recovery import assert_nothing_bills, newest_live

RUN_KNOBS = ("--python", sys.executable, "--deps", "none", "--poll-s", "0.2", "--ready-deadline-s", "60",
             "--watchdog-poll-s", "0.2", "--preempt-confirm-s", "3")


def env_for(runpod, trainer: str) -> dict[str, str]:
    return cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                   LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url, LORAPOD_JOB_COMMAND=trainer)


def start(spec: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*cli_argv(), "run", str(spec), "--on", "runpod", "--json", *RUN_KNOBS, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=env, timeout=timeout)


def wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}: {proc.communicate()}")
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, dict, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), " ".join(err.split())


def whole_home(tmp_path: Path) -> int:
    """The newest checkpoint that came home whole (every file as its manifest says), 0 for none."""
    runs = list((tmp_path / "runs").glob("*/checkpoints"))
    return max((s for r in runs for s, p in checkpoints_by_step(r) if whole(p)), default=0)


def job_id() -> str:
    return Ledger().jobs()[0].id


def preempt_now(runpod) -> None:
    """RunPod takes the running spot pod back (SIGTERM, SIGKILL 0.5 s later), from a thread: the
    fake's stop waits out the grace."""
    pod = newest_live(runpod)
    threading.Thread(target=runpod.preempt, args=(pod, 0.5), daemon=True).start()


def hold_the_replacement(runpod, moment: str) -> None:
    """Keep the recovery in the window the test acts in: the husk's destroy acted on but its answer
    8 s late, the replacement's create acted on but its answer 8 s late, or the replacement
    booting for 8 s (its image pull)."""
    if moment == "husk destroyed":
        runpod.faults.append(Fault("DELETE", r"/pods/\w+", 0, delay_s=8.0))
    elif moment.startswith("create in flight"):
        runpod.faults.append(Fault("POST", r"/graphql", 0, delay_s=8.0, body_has="podRentInterruptable"))
    elif moment == "booting":
        runpod.pull_s = 8.0


def in_the_window(runpod, moment: str) -> bool:
    """The recovery is where ``moment`` says: the husk gone and nothing rented yet; the
    replacement created (its answer in flight, or booting); the replacement running and being set
    up (its bootstrap, the run folder pushed back, the job started: ``down`` lands somewhere there)."""
    pods = list(runpod.instances.values())
    if moment == "husk destroyed":
        return len(pods) == 1 and pods[0].deleted
    if moment == "setting up":
        return len(pods) == 2 and pods[1].ready
    return len(pods) == 2


# ----------------------------------------------------------------------------- down and stop win over recovery

@pytest.mark.parametrize("moment", ["husk destroyed", "create in flight", "booting", "setting up",
                                    "create in flight, after a stop"])
def test_down_during_a_spot_recovery_rents_nothing_more_and_ends_destroyed(runpod, tmp_path, remote_root, moment):
    """``down`` at each moment of a recovery, from the husk's destroy to the replacement's set-up
    (and after a ``stop`` in the same window, as the issue saw it twice): nothing billing after it,
    nothing rented after it, the job ended at the user's request."""
    spec = make_spec(tmp_path, max_steps=40, every=2, max_usd=1.0)
    env = env_for(runpod, fake_command_template(0.25, "--chain"))
    proc = start(spec, env, "--spot", "always", "--pull-every-s", "0.3", "--heartbeat-timeout-s", "60")
    try:
        wait_for(lambda: remote_step(remote_root) >= 5, 120, "step 5", proc)
        hold_the_replacement(runpod, moment)
        preempt_now(runpod)
        wait_for(lambda: in_the_window(runpod, moment), 120, f"the recovery at: {moment}", proc)
        rented = len(runpod.instances)
        if moment.endswith("after a stop"):
            stop = cli("stop", job_id(), env=env)
            assert stop.returncode == 0, stop.stderr
        down = cli("down", job_id(), env=env)
        assert down.returncode == 0, down.stderr
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    assert summary["state"] == "stopped" and "at your request" in summary["message"], summary
    if not moment.endswith("after a stop"):  # a stop alone may already have ended it: then down had nothing to do
        assert "destroyed at your request" in summary["message"], summary
    assert len(runpod.instances) == rented, "an instance was rented after `lorapod down`"
    (row,) = json.loads(cli("ps", "--json", env=env).stdout)
    assert row["state"] == "stopped" and "at your request" in row["summary"]
    assert_nothing_bills(runpod, Ledger(), remote_root)


def test_stop_during_a_spot_recovery_stops_at_the_newest_checkpoint_home(runpod, tmp_path, remote_root):
    spec = make_spec(tmp_path, max_steps=40, every=2, max_usd=1.0)
    env = env_for(runpod, fake_command_template(0.25, "--chain"))
    proc = start(spec, env, "--spot", "always", "--pull-every-s", "0.3", "--heartbeat-timeout-s", "60")
    try:
        wait_for(lambda: remote_step(remote_root) >= 7, 120, "step 7", proc)
        wait_for(lambda: whole_home(tmp_path) >= 4, 120, "a whole checkpoint at step 4 or later home", proc)
        hold_the_replacement(runpod, "create in flight")
        preempt_now(runpod)
        wait_for(lambda: len(runpod.instances) == 2, 120, "the replacement's create", proc)
        stop = cli("stop", job_id(), env=env)
        assert stop.returncode == 0, stop.stderr  # it used to say "has no live instance to stop"
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    assert summary["state"] == "stopped" and "stopped at your request" in summary["message"], summary
    run = Path(summary["run_dir"])
    steps = [s for s, _ in checkpoints_by_step(run / "checkpoints")]
    assert steps and max(steps) >= 4  # the newest checkpoint home before the preemption stands
    assert f"lorapod run --resume {summary['job_id']}" in summary["message"]
    assert len(runpod.instances) == 2
    assert_nothing_bills(runpod, Ledger(), remote_root)


def test_down_on_a_running_job_brings_its_checkpoint_home_and_is_not_a_failure(runpod, tmp_path, remote_root):
    """Issue 48 F4: the controller pulls nothing on its own here (a pull every 10 minutes), so the
    checkpoint at step 8 exists only on the instance when `down` arrives."""
    spec = make_spec(tmp_path, max_steps=400, every=8)
    env = env_for(runpod, fake_command_template(0.2))
    proc = start(spec, env, "--pull-every-s", "600", "--heartbeat-timeout-s", "60")
    try:
        wait_for(lambda: any(remote_root.glob("*/run/checkpoints/step-8")), 120, "checkpoint 8 on the instance", proc)
        down = cli("down", job_id(), env=env)
        assert down.returncode == 0, down.stderr
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    assert summary["state"] == "stopped" and "destroyed at your request" in summary["message"], summary
    assert "vanished" not in summary["message"] and "failed" not in summary["message"]
    steps = [s for s, _ in checkpoints_by_step(Path(summary["run_dir"]) / "checkpoints")]
    assert steps and max(steps) >= 8, "the checkpoint the instance had never came home"
    (row,) = json.loads(cli("ps", "--json", env=env).stdout)
    assert row["state"] == "stopped"
    assert_nothing_bills(runpod, Ledger(), remote_root)


# ----------------------------------------------------------------------------- the provider's word

def test_a_finished_job_whose_watchdog_destroyed_its_pod_ends_done_and_bills_what_the_provider_billed(
        runpod, tmp_path, remote_root):
    """The controller is frozen (SIGSTOP) as the job ends: its heartbeat stops, so the instance's
    watchdog destroys the finished pod. Resumed, the controller asks RunPod before reconnecting:
    the pod is gone, the adapter came home before, the job is done, and the ledger stops the
    pod's dollars where RunPod did (not after 10 minutes of reconnecting)."""
    spec = make_spec(tmp_path, max_steps=10, every=5)
    env = env_for(runpod, fake_command_template(0.2, "--linger-s 3"))  # the adapter is written 3 s before the exit
    proc = start(spec, env, "--pull-every-s", "0.3", "--heartbeat-timeout-s", "2", "--reconnect-s", "600")
    stopped = False
    try:
        wait_for(lambda: any((d / "run" / "adapter").is_dir() for d in remote_root.iterdir()), 120,
                 "the adapter on the instance", proc)
        run = lambda: next(Path(tmp_path / "runs").iterdir())  # noqa: E731
        wait_for(lambda: (run() / "adapter" / "adapter_model.safetensors").is_file(), 60, "the adapter home", proc)
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = True
        (pod,) = runpod.instances.values()
        wait_for(lambda: pod.deleted, 60, "the watchdog's destroy")
        os.kill(proc.pid, signal.SIGCONT)
        stopped = False
        code, summary, err = finish(proc, timeout=120)  # it used to reconnect for --reconnect-s (600 s)
    finally:
        if stopped:
            os.kill(proc.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-3000:]
    assert summary["state"] == "done" and summary["last_step"] == 10, summary  # its last step came home with the adapter
    assert "no longer exists" in summary["message"], summary  # asked, not reconnected to (finish's 120 s bound it)
    assert pod.deleted_by == "pod-scoped key"  # its own watchdog, not the controller
    (row,) = Ledger().instances()
    assert row.state == "destroyed"
    billed_h = (pod.deleted_at - pod.created) / 3600
    recorded_h = (row.destroyed_at - row.created_at) / 3600
    assert recorded_h <= billed_h + 15 / 3600, (recorded_h * 3600, billed_h * 3600)
    assert_nothing_bills(runpod, Ledger(), remote_root)


def test_a_husk_whose_destroy_is_never_confirmed_exits_3_without_claiming_a_watchdog(runpod, tmp_path, remote_root):
    """Preempted during its setup, before any step: the husk's DELETE is refused for good, so the
    job stops there (nothing more rented) and says so in red; `down` settles it once RunPod
    answers again."""
    spec = make_spec(tmp_path, max_steps=20, every=2, max_usd=1.0)
    env = env_for(runpod, fake_command_template(0.25, "--chain"))
    proc = start(spec, env, "--spot", "always", "--pull-every-s", "0.3", "--heartbeat-timeout-s", "60",
                 "--destroy-deadline-s", "3")
    try:
        wait_for(lambda: any(remote_root.glob("*/watchdog.pid")), 120, "the watchdog on the pod", proc)
        runpod.faults.append(Fault("DELETE", r"/pods/\w+", 400, times=10**6, body={"error": "injected"}))
        runpod.refuse_terminate = True
        preempt_now(runpod)
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, err[-3000:]
    (pod,) = runpod.instances.values()
    assert pod.id in err and "NOT confirmed destroyed" in err and "may still bill" in err
    assert "watchdog keeps trying" not in err
    assert "before its first step" in err and "step None" not in err
    assert len(runpod.instances) == 1  # nothing more rented while the husk may bill
    runpod.faults.clear()
    runpod.refuse_terminate = False
    assert cli("down", summary["job_id"], env=env).returncode == 0
    assert_nothing_bills(runpod, Ledger(), remote_root)
