"""The `local` provider (this machine's shell, same lifecycle), the watchdog's stall rule, and the
wheel bootstrap strategy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorapod.compute.local import LocalProvider
from lorapod.compute.remote import Bootstrap, RemoteWork, build_wheel
from lorapod.compute.session import run_remote
from lorapod.compute.transport import LocalTransport
from lorapod.errors import RemoteError
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .conftest_ssh import require_tools
from .remote_helpers import REPO, fake_command, fast_options, make_spec


@pytest.fixture(autouse=True)
def _rsync():
    require_tools("rsync")


def run_local(tmp_path, **kw):
    spec_path = make_spec(tmp_path, **kw.pop("spec_kw", {}))
    provider = LocalProvider(home=tmp_path / "machine")
    ledger = Ledger()
    opts = fast_options(**kw)
    return run_remote(load_spec(spec_path), provider, "local", opts, ledger, str(spec_path), say=lambda m: None), \
        ledger, tmp_path / "machine" / ".lorapod-work"


def test_local_provider_runs_the_same_lifecycle(tmp_path):
    summary, ledger, work = run_local(tmp_path, job_command=fake_command(0.02))
    assert summary.state == "done" and summary.last_step == 8
    assert (summary.run_dir / "adapter" / "adapter_config.json").is_file()
    assert list(work.iterdir()) == [] and ledger.instances(live_only=True) == []


def test_stalled_job_is_stopped_by_the_watchdog(tmp_path):
    # The trainer hangs inside step 3 and ignores STOP; after stall_s the watchdog writes STOP, waits
    # stop_wait_s, kills it. The controller pulls what exists, reports it, and destroys.
    with pytest.raises(RemoteError, match="watchdog stopped the job at step 2") as exc:
        run_local(tmp_path, job_command=fake_command(0.05, ("--hang-at", "3")),
                  watchdog={"poll_s": 0.2, "stall_s": 1.0, "stop_wait_s": 1.0, "heartbeat_timeout_s": 30})
    assert "--resume" in exc.value.hint
    ledger = Ledger()
    (job,) = ledger.jobs()
    assert job.state == "failed" and ledger.instances(live_only=True) == []
    run_dir = Path(job.run_dir)
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    wd_log = (run_dir / "watchdog.log").read_text()
    assert "asking the job to checkpoint and stop (no progress" in wd_log and "stopping the job" in wd_log


def test_wheel_bootstrap_installs_the_same_version(tmp_path):
    def litter() -> set[str]:  # what a build could leave in the checkout (an editable install has egg-info)
        return {str(p) for p in [REPO / "build", *(REPO / "src").glob("*.egg-info")] if p.exists()}

    before = litter()
    wheel = build_wheel(tmp_path / "wheels")
    assert wheel.name.startswith("lorapod-") and wheel.suffix == ".whl"
    assert build_wheel(tmp_path / "wheels") == wheel  # cached by content
    assert litter() == before
    w = RemoteWork(LocalTransport(tmp_path / "m"), "wheeljob")
    w.prepare()
    facts = w.bootstrap(Bootstrap("wheel", python=sys.executable), tmp_path / "wheels")
    assert facts["path"].startswith(str(tmp_path / "m")) and "/pkg/lorapod/" in facts["path"]
    # the installed copy runs without this checkout on the path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", "import lorapod.compute.watchdog as w; print(w.__file__)"],
                         cwd=tmp_path / "m" / ".lorapod-work" / "wheeljob",
                         env={**env, "PYTHONPATH": "pkg"}, capture_output=True, text=True, check=True)
    assert "pkg/lorapod/compute/watchdog.py" in out.stdout


def test_max_hours_cap_checkpoints_and_stops(tmp_path):
    # 12 s allowed; STOP 7 s before: the job (100 x 0.1 s) is stopped around t = 5 s with a checkpoint.
    summary, ledger, work = run_local(tmp_path, spec_kw={"max_steps": 100, "every": 1000},
                                      job_command=fake_command(0.1), max_hours=12 / 3600, stop_margin_s=7.0)
    assert summary.state == "stopped" and "max-hours" in summary.message, summary.message
    (ck,) = (summary.run_dir / "checkpoints").iterdir()
    assert ck.name == f"step-{summary.last_step}" and summary.last_step < 100
    assert list(work.iterdir()) == [] and ledger.instances(live_only=True) == []


def test_heartbeat_thread_keeps_a_slow_controller_alive_for_the_watchdog(tmp_path):
    # The controller polls every 3 s but the watchdog calls it silent after 1.2 s: only the
    # heartbeat thread keeps the watchdog from destroying the finished job before it is pulled.
    summary, ledger, work = run_local(tmp_path, job_command=fake_command(0.02), poll_s=3.0,
                                      watchdog={"poll_s": 0.2, "heartbeat_timeout_s": 1.2, "done_grace_s": 60,
                                                "stall_s": 60})
    assert summary.state == "done" and (summary.run_dir / "adapter").is_dir()
    assert list(work.iterdir()) == [] and ledger.instances(live_only=True) == []


def test_an_ended_job_is_measured_for_the_planner_at_once(tmp_path):
    # The job's GPU comes from the run folder's device.json (the local provider's instance only knows
    # "this host"); the controller records it when the job ends, and planning reads it, not again.
    from lorapod.plan.choose import plan_job

    summary, ledger, _ = run_local(tmp_path, job_command=fake_command(0.02, ("--device-name", "NVIDIA GeForce RTX 4090")),
                                   spec_kw={"model": "Qwen/Qwen2.5-0.5B"})
    assert summary.state == "done" and ledger.job_instances(summary.job_id)[0].gpu_name == "this host"
    (m,) = ledger.measurements()
    spec = load_spec(summary.run_dir / "spec.yaml")
    assert (m["job_id"], m["gpu_name"], m["model"], m["steps"]) == (summary.job_id, "RTX 4090", "Qwen2.5 0.5B", 5)
    assert m["seconds_per_step"] == pytest.approx(0.02 / spec.train.grad_accum)
    assert m["peak_gb"] == pytest.approx(5.08)
    speed = plan_job(spec, gpu="RTX 4090").options[0].speed
    assert speed.basis == "your runs" and [r.job_id for r in speed.runs] == [summary.job_id]
    assert ledger.measurements() == [m]


def test_run_piped_prints_progress_like_train_not_a_line_per_step(tmp_path, monkeypatch):
    """`run --on local | tee` printed every step (320 lines for the demo) where `train` prints the
    first, one every 30 s and the last (issue #38). Piped here: stderr is not a terminal."""
    monkeypatch.setenv("LORAPOD_PROGRESS_SECONDS", "3600")
    said: list[str] = []
    spec_path = make_spec(tmp_path)
    provider = LocalProvider(home=tmp_path / "machine")
    summary = run_remote(load_spec(spec_path), provider, "local", fast_options(job_command=fake_command(0.02), every_step=None),
                         Ledger(), str(spec_path), say=said.append)
    assert summary.state == "done" and summary.last_step == 8
    steps = [s for s in said if s.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/8", "8/8"], said


def test_poll_waits_for_the_watchdogs_verdict_while_it_stops_the_job(tmp_path):
    """job.sh passes the watchdog's SIGTERM on and writes the job's own status (143) a moment before
    kill_job replaces it with 'killed: REASON'; a poll in between must not take 143 as the end (the
    controller then reported a watchdog stop as 'stopped', or a failure, under load)."""
    w = RemoteWork(LocalTransport(tmp_path / "m"), "killjob")
    w.prepare()
    folder = tmp_path / "m" / w.dir  # relative to the transport's home
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / "job.pid").write_text(f"{dead.pid}\n")
    (folder / "job.exit").write_text("143\n")
    assert w.poll(0).exit == "143"  # no watchdog stopping it: the status is final
    (folder / "job.killing").write_text("no progress for 1 s\n")
    st = w.poll(0)
    assert st.exit is None and st.alive and not st.done
    (folder / "job.exit").write_text("killed: no progress for 1 s (the job exited 143)\n")
    st = w.poll(0)
    assert st.done and st.exit.startswith("killed:")
    (folder / "job.exit").write_text("143\n")
    os.utime(folder / "job.killing", (0, 0))  # a marker a minute old: its watchdog died mid-stop
    assert w.poll(0).exit == "143"


def test_a_borrowed_host_is_used_not_created_and_a_job_that_trained_nothing_is_not_resumed(tmp_path):
    """Issue 48, F13: `run --on local` said "creating RTX 3090" (compute.gpu) on a machine without
    a GPU, and a job that died before its first step was told to `--resume`."""
    spec_path = make_spec(tmp_path, gpu="RTX 3090")
    said: list[str] = []
    with pytest.raises(RemoteError) as exc:
        run_remote(load_spec(spec_path), LocalProvider(home=tmp_path / "machine"), "local",
                   fast_options(job_command=fake_command(0.02, ("--fail-at", "1"))), Ledger(), str(spec_path),
                   say=said.append)
    text = "\n".join(said)
    assert "creating" not in text and "using the local host" in text and "planned as RTX 3090" in text
    assert "before its first step" in exc.value.message
    hint = exc.value.hint or ""
    assert "--resume" not in hint and "nothing was trained" in hint and "lorapod run SPEC --on local" in hint
