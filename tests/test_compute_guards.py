"""Two guards on the instance that watch each other (issue 22, item 4 of the findings).

A host that killed the watchdog went unnoticed (the run ended `done`, nothing said, nothing in
`ps`), and when the controller died too the instance stayed up after the job until someone ran
`down --orphans`. Now the controller checks the watchdog on every poll and restarts it; `ps`
shows a job whose watchdog is down; the job's runner restarts it when both are gone, and the
watchdog then destroys the instance from inside. Durations are monotonic.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from lorapod.compute.jobs import ps_rows
from lorapod.compute.local import LocalProvider
from lorapod.compute.session import run_remote
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .remote_helpers import fake_command, fake_command_template, fast_options, make_spec
from .test_compute_session_faults import assert_nothing_bills, cli, env_for, start_run, wait_for


def kill_watchdog(work_root: Path) -> int:
    (pid_file,) = work_root.glob("*/watchdog.pid")
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


def local_run(tmp_path, say, **opts):
    spec = make_spec(tmp_path, max_steps=40, every=10)
    return run_remote(load_spec(spec), LocalProvider(home=tmp_path / "machine"), "local",
                      fast_options(job_command=fake_command(0.1), **opts), Ledger(), str(spec), say=say)


def test_a_killed_watchdog_is_noticed_and_started_again(tmp_path):
    work = tmp_path / "machine" / ".lorapod-work"
    lines: list[str] = []
    killed: list[int] = []

    def say(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("step 3") and not killed:
            killed.append(kill_watchdog(work))

    summary = local_run(tmp_path, say)
    assert killed and summary.state == "done", summary.message
    assert any("watchdog on the instance is not running (killed?); starting it again (1/5)" in x for x in lines), lines
    log = (summary.run_dir / "watchdog.log").read_text()
    assert log.count("watchdog: watching") == 2, log  # the first one, and the one started again
    kinds = [e["message"] for e in Ledger().events(summary.job_id) if e["kind"] == "watchdog"]
    assert kinds == ["down: restarting", "restarted"]
    assert Ledger().instances(live_only=True) == [] and list(work.iterdir()) == []


def test_ps_shows_a_job_whose_watchdog_is_down(tmp_path):
    work = tmp_path / "machine" / ".lorapod-work"
    lines: list[str] = []
    seen: list[str | None] = []

    def say(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("step 3") and not seen:
            kill_watchdog(work)
            seen.append("killed")
        elif msg.startswith("step") and any(x.startswith("WARNING: the watchdog") for x in lines) and len(seen) == 1:
            (row,) = ps_rows(Ledger.read_only())
            seen.append(row["watchdog"])

    summary = local_run(tmp_path, say, watchdog_restarts=0)
    assert summary.state == "done", summary.message
    assert seen == ["killed", "down"], lines
    assert any("nothing on the instance destroys it if this controller dies" in x for x in lines)


def test_the_job_runner_restarts_the_watchdog_when_both_guards_are_gone(runpod, tmp_path, remote_root):
    """Controller and watchdog SIGKILLed mid-job: the job's runner starts the watchdog again,
    which destroys the pod from inside once the job ends (before: the pod billed on)."""
    env = env_for(runpod, LORAPOD_JOB_COMMAND=fake_command_template(0.2))
    proc = start_run(make_spec(tmp_path, max_steps=25, every=100), "runpod", env)
    try:
        wait_for(lambda: any(remote_root.glob("*/job.pid")) and any(remote_root.glob("*/run/metrics.jsonl")), 60,
                 "the job to run", every=0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kill_watchdog(remote_root)
    finally:
        if proc.poll() is None:
            proc.kill()
    logs: list[str] = []

    def destroyed() -> bool:  # the fake wipes the pod's disk with it: read its log while it lasts
        logs.extend(p.read_text() for p in remote_root.glob("*/watchdog.log"))
        return not runpod.live()

    wait_for(destroyed, 60, "the restarted watchdog to destroy the pod", every=0.1)
    (pod,) = runpod.instances.values()
    assert pod.deleted_by == "pod-scoped key"
    log = logs[-1]
    assert "guard: the watchdog and the controller are both gone; starting the watchdog again" in log
    out = cli("down", "--orphans", "--json", env=env_for(runpod))
    assert out.returncode == 0 and json.loads(out.stdout)["reconciled"] == 1, out.stderr
    assert_nothing_bills(runpod, Ledger())


def test_a_clock_stepped_back_does_not_extend_the_watchdogs_cap(tmp_path, monkeypatch):
    """The cap is 1 s after start; the wall clock is set back an hour right after the watchdog
    starts: it still destroys at about 1 s (measured with time.time(), it waited an hour)."""
    import lorapod.compute.watchdog as wd

    class SteppedClock:
        """The watchdog's `time`: the wall clock goes back an hour after its first reading."""

        monotonic = staticmethod(time.monotonic)  # before `def time` below shadows the module here
        strftime = staticmethod(time.strftime)
        wall = staticmethod(time.time)

        def __init__(self) -> None:
            self.calls, self.t0 = 0, time.monotonic()

        def time(self) -> float:
            self.calls += 1
            return self.wall() - (3600.0 if self.calls > 1 else 0.0)

        def sleep(self, s: float) -> None:
            if self.monotonic() - self.t0 > 5:
                raise TimeoutError("the cap never fired")
            _sleep(s)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "watchdog.json").write_text(json.dumps({"max_hours": 1 / 3600, "provider": "local", "poll_s": 0.05}))
    done: list[str] = []
    monkeypatch.setattr(wd, "destroy", lambda cfg, why, attempt=1: done.append(why) or True)
    _sleep = time.sleep
    clock = SteppedClock()
    monkeypatch.setattr(wd, "time", clock)
    monkeypatch.setattr(wd.signal, "signal", lambda *a: None)
    assert wd.main() == 0 and done
    assert time.monotonic() - clock.t0 < 3


def test_file_clock_places_changes_on_the_monotonic_clock():
    from lorapod.compute.watchdog import FileClock

    c = FileClock()
    assert c.place("hb", 1000.0, mono_now=50.0, wall_now=1010.0) == 40.0  # first seen: 10 s old
    assert c.place("hb", 1000.0, mono_now=60.0, wall_now=500.0) == 40.0  # wall clock stepped back: unchanged
    assert c.place("hb", 400.0, mono_now=61.0, wall_now=500.0) == 61.0  # touched again: now
    assert c.place("hb", None, mono_now=62.0, wall_now=500.0) is None


def test_a_restart_the_host_undoes_is_down_in_ps_not_up(tmp_path):
    """The host kills the watchdog and keeps its lock (so guard.sh's and the controller's restarts
    exit at once, as the watchdog does when another holds watchdog.lock). Before: the controller
    recorded "restarted" without looking, and `ps` said the watchdog was up while none ran."""
    import fcntl

    work = tmp_path / "machine" / ".lorapod-work"
    lines: list[str] = []
    seen: list[str | None] = []
    held: list = []

    def say(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("step 3") and not held:
            kill_watchdog(work)
            (lock,) = work.glob("*/watchdog.lock")
            fh = open(lock, "a")  # held past this call, closed below
            end = time.monotonic() + 10
            while True:  # the killed watchdog's lock goes with it
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.02)
            held.append(fh)
        elif msg.startswith("step") and held and not seen and any("starting it again" in x for x in lines):
            (row,) = ps_rows(Ledger.read_only())
            seen.append(row["watchdog"])

    try:
        summary = local_run(tmp_path, say, watchdog_restarts=1)
    finally:
        for fh in held:
            fh.close()
    assert summary.state == "done", summary.message
    assert seen == ["down"], lines
    assert any("did not stay up" in x for x in lines), lines
    kinds = [e["message"] for e in Ledger().events(summary.job_id) if e["kind"] == "watchdog"]
    assert kinds[:2] == ["down: restarting", "down: the restart did not take"], kinds


def test_ps_says_unknown_not_up_when_no_controller_follows_the_job(tmp_path):
    """The controller is gone (killed) and the host killed the watchdog and guard.sh: nobody looks,
    so `ps` cannot say "up". Before: "up", from the absence of any event."""
    import socket

    ledger = Ledger()
    ledger.job_started("orphan-job", str(tmp_path / "run"), "runpod", "runpod", None, 1.0, None)
    ledger.job_update("orphan-job", state="running", controller=f"{socket.gethostname()}:999999999")  # gone
    ledger.instance_created(ledger.instance_creating("runpod", "orphan-job", 0.5, "RTX 4090"), "pod-1")
    (row,) = ps_rows(Ledger.read_only())
    assert row["watchdog"] == "unknown"
    from .remote_helpers import cli_env

    out = cli("ps", env=cli_env(COLUMNS="200"))
    assert "nobody checks the watchdog" in " ".join(out.stdout.split()), out.stdout
