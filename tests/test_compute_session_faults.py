"""Teardown and trust under faults: no fault leaves an instance billing, no host reaches this machine.

Fault injection on the contract-validated fake control planes (real loopback sshd "instances")
and on the local provider. Every test that rents something ends with zero live instances at the
fake provider and a ledger that agrees. docs/remote.md maps each fault to the test here.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.compute.joblogs import follow_logs
from lorapod.compute.jobs import down_orphans
from lorapod.compute.provider import InstanceSpec, Offer
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.session import run_remote
from lorapod.spec import load_spec
from lorapod.store.identity import instance_label
from lorapod.store.ledger import Ledger

from .fakes.base import Fault
from .fakes.runpod_fake import RunPodFake
from .remote_helpers import cli_argv, cli_env, fake_command, fake_command_template, fast_options, make_spec

RTX3090 = Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 test"


def provider(fake: RunPodFake, timeout: float = 10) -> RunPodProvider:
    return RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=timeout, retries=2))


def env_for(fake: RunPodFake, **extra: str) -> dict[str, str]:
    return cli_env(RUNPOD_API_KEY=fake.account_key, LORAPOD_RUNPOD_URL=fake.url,
                   LORAPOD_RUNPOD_GRAPHQL_URL=fake.graphql_url, **extra)


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=env, timeout=timeout)


def start_run(spec: Path, target: str, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*cli_argv(), "run", str(spec), "--on", target, "--python", sys.executable,
                             "--poll-s", "0.2", "--pull-every-s", "0.5", "--ready-deadline-s", "20",
                             "--watchdog-poll-s", "0.2", "--heartbeat-timeout-s", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


#: for the tests whose controller lives throughout: start_run's 2 s heartbeat timeout (for the tests
#: that kill the controller) let the watchdog, once, stop a job before its first step on a loaded
#: machine, where an SSH heartbeat took longer (the last value of a repeated option wins)
PATIENT_WATCHDOG = ("--heartbeat-timeout-s", "60")


def wait_for(cond, timeout: float, what: str, every: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"timed out: {what}")


def assert_nothing_bills(fake: RunPodFake, ledger: Ledger) -> None:
    assert fake.live() == [], "an instance is still alive at the provider"
    assert fake.running_processes() == []
    assert ledger.instances(live_only=True) == []
    assert fake.violations == [], fake.violations


def posts(fake: RunPodFake) -> list[int]:
    return [status for method, path, status in fake.calls if (method, path) == ("POST", "/pods")]


# ----------------------------------------------------------------------------- the watchdog


def scoped(fake: RunPodFake, pod_id: str) -> str:
    return next(k for k, v in fake.pod_keys.items() if v == pod_id)


def watchdog_env(fake: RunPodFake, pod_id: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": scoped(fake, pod_id)}


def start_watchdog(work: Path, cfg: dict, env: dict[str, str], full_disk: bool) -> subprocess.Popen:
    import lorapod.compute.watchdog as wd

    work.mkdir(parents=True, exist_ok=True)
    (work / "watchdog.py").write_bytes(Path(wd.__file__).read_bytes())
    (work / "watchdog.json").write_text(json.dumps(cfg))

    def no_space() -> None:  # every write fails (EFBIG) and stdout is /dev/full (ENOSPC)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    out = open("/dev/full" if full_disk else work / "watchdog.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "watchdog.py"], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=no_space if full_disk else None)
    finally:
        out.close()


def test_watchdog_with_a_full_disk_never_gives_up_destroying(runpod, tmp_path):
    """No disk space at all (its pid file, log and job.exit all fail) and 25 refused DELETEs,
    more than the 21 the watchdog used to allow itself: it still destroys the pod, from inside."""
    pod = provider(runpod).create(RTX3090, InstanceSpec("full", KEY))
    # each attempt runs the provider's recipe: GraphQL podTerminate (failing here), runpodctl, REST
    runpod.faults.append(Fault("POST", r"/graphql", 500, times=25))
    cfg = {**provider(runpod).watchdog_config(pod), "heartbeat_timeout_s": 0.0, "poll_s": 0.02,
           "destroy_backoff_s": 0.01, "destroy_backoff_max_s": 0.05, "http_timeout_s": 5}
    proc = start_watchdog(tmp_path / "work", cfg, watchdog_env(runpod, pod.id), full_disk=True)
    assert proc.wait(60) == 0
    assert runpod.instances[pod.id].deleted_by == "pod-scoped key"
    assert [s for m, p, s in runpod.calls if (m, p) == ("POST", "/graphql")] == [500] * 25 + [200]
    assert not (tmp_path / "work" / "watchdog.pid").exists()  # nothing could be written, and it carried on
    assert runpod.live() == [] and runpod.violations == []


def test_watchdog_logs_each_attempt_where_lorapod_logs_shows_it(runpod, tmp_path):
    pod = provider(runpod).create(RTX3090, InstanceSpec("logs", KEY))
    runpod.faults.append(Fault("POST", r"/graphql", 503, times=2))
    cfg = {**provider(runpod).watchdog_config(pod), "heartbeat_timeout_s": 0.0, "poll_s": 0.02,
           "destroy_backoff_s": 0.01, "destroy_backoff_max_s": 0.05}
    work = tmp_path / "work"
    assert start_watchdog(work, cfg, watchdog_env(runpod, pod.id), full_disk=False).wait(30) == 0
    ledger = Ledger()
    ledger.job_started("jlogs", str(work), "runpod", "runpod", None, None, None)
    ledger.job_ended("jlogs", "done", "ok")
    shown = [line for line in follow_logs(ledger, "jlogs", follow=False) if line.startswith("[watchdog.log]")]
    attempts = [line for line in shown if "destroying (attempt" in line]
    assert len(attempts) == 3 and "attempt 3" in attempts[-1]
    assert any("GraphQL podTerminate: HTTP 200" in line for line in shown)
    assert runpod.live() == []


def test_watchdog_on_a_borrowed_host_ends_when_its_folder_is_gone(tmp_path):
    import shutil

    cfg = {"provider": "local", "heartbeat_timeout_s": 0.0, "poll_s": 0.02}
    work = tmp_path / "work"
    cfg["heartbeat_timeout_s"] = 0.5
    proc = start_watchdog(work, cfg, {"PATH": os.environ["PATH"]}, full_disk=False)
    wait_for(lambda: (work / "watchdog.pid").exists(), 20, "the watchdog to start")
    shutil.rmtree(work)  # removed under it (lorapod down, or the controller's teardown)
    assert proc.wait(20) == 0


def test_controller_sigkilled_during_bootstrap(runpod, tmp_path, remote_root):
    """The watchdog starts as soon as SSH answers: a controller killed before the job starts
    still leaves nothing billing."""
    proc = start_run(make_spec(tmp_path), "runpod", env_for(runpod, LORAPOD_JOB_COMMAND=fake_command_template(0.1)))
    try:
        wait_for(lambda: any(remote_root.glob("*/watchdog.pid")), 60, "the watchdog to start", every=0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any(remote_root.glob("*/job.pid")), "the job had started: not a kill during bootstrap"
    wait_for(lambda: not runpod.live(), 30, "the watchdog to destroy the pod")
    (pod,) = runpod.instances.values()
    assert pod.deleted_by == "pod-scoped key"
    out = cli("down", "--orphans", "--json", env=env_for(runpod))
    assert out.returncode == 0 and json.loads(out.stdout)["reconciled"] == 1, out.stderr
    assert_nothing_bills(runpod, Ledger())


# ----------------------------------------------------------------------------- create


def test_create_that_times_out_after_the_provider_accepted_it(runpod, tmp_path):
    """POST /pods creates the pod but answers after the client gave up: lorapod finds it by its
    label instead of creating a second one."""
    runpod.faults.append(Fault("POST", "/pods", 0, times=1, delay_s=2.0))
    spec = make_spec(tmp_path)
    ledger = Ledger()
    lines: list[str] = []
    summary = run_remote(load_spec(spec), provider(runpod, timeout=0.8), "runpod",
                         fast_options(job_command=fake_command(0.02), create_settle_s=10), ledger, str(spec),
                         say=lines.append)
    assert summary.state == "done", summary.message
    # no cap was set and the planner cannot price the test model: the default is said at launch
    assert any("watchdog started on the instance (default cap 24 h" in x for x in lines), lines
    assert posts(runpod) == [201] and len(runpod.instances) == 1
    (row,) = ledger.instances()
    (pod,) = runpod.instances.values()
    assert row.provider_id == pod.id and row.state == "destroyed"
    assert pod.label == instance_label(row.id, summary.job_id)
    assert_nothing_bills(runpod, ledger)


def test_ctrl_c_during_create_records_and_destroys_the_pod(runpod, tmp_path):
    runpod.faults.append(Fault("POST", "/pods", 0, times=1, delay_s=20.0))
    proc = start_run(make_spec(tmp_path), "runpod", env_for(runpod, LORAPOD_JOB_COMMAND=fake_command_template(0.1)))
    try:
        wait_for(lambda: runpod.instances, 60, "the pod to exist (its create still unanswered)")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    ledger = Ledger()
    (row,) = ledger.instances()
    (pod,) = runpod.instances.values()
    assert (row.provider_id, row.state) == (pod.id, "destroyed") and row.destroyed_at > row.created_at
    assert_nothing_bills(runpod, ledger)


# ----------------------------------------------------------------------------- destroy


def test_destroy_failing_a_few_times_is_retried_until_confirmed(runpod, tmp_path):
    runpod.faults.append(Fault("DELETE", r"/pods/\w+", 500, times=5))
    spec = make_spec(tmp_path)
    ledger = Ledger()
    summary = run_remote(load_spec(spec), provider(runpod), "runpod", fast_options(job_command=fake_command(0.02)),
                         ledger, str(spec), say=lambda m: None)
    assert summary.state == "done" and summary.unconfirmed is None
    assert_nothing_bills(runpod, ledger)


def test_destroy_failing_forever_exits_non_zero_ps_red_down_retries(runpod, tmp_path):
    # refused (400: not retried inside the HTTP client), for the controller and the watchdog alike
    runpod.faults.append(Fault("DELETE", r"/pods/\w+", 400, times=10**6, body={"error": "injected"}))
    runpod.refuse_terminate = True  # the watchdog's GraphQL path too
    env = env_for(runpod, LORAPOD_JOB_COMMAND=fake_command_template(0.02))
    # a controller silent for 2 s (a loaded machine's SSH heartbeat) is not what this test is about:
    # the watchdog must not stop the job before its first step
    proc = start_run(make_spec(tmp_path), "runpod", env, "--destroy-deadline-s", "2", *PATIENT_WATCHDOG)
    _, err = proc.communicate(timeout=120)
    err = " ".join(err.split())  # the console wraps long lines
    (pod,) = runpod.instances.values()
    assert proc.returncode == 3, err
    assert not pod.deleted
    job = Ledger().jobs()[0].id
    assert pod.id in err and "runpod.io/console/pods" in err and f"lorapod down {job}" in err
    (row,) = json.loads(cli("ps", "--json", env=env).stdout)
    assert row["unconfirmed"] == [pod.id]
    ps = cli("ps", env={**env, "FORCE_COLOR": "1", "COLUMNS": "200"})
    assert "\x1b[1;31m" in ps.stdout and "not confirmed destroyed" in ps.stdout
    runpod.faults.clear()  # the provider recovers
    runpod.refuse_terminate = False
    out = cli("down", job, env=env)
    assert out.returncode == 0, out.stderr
    assert_nothing_bills(runpod, Ledger())


def test_second_signal_during_a_failing_destroy_ends_the_controller(runpod, tmp_path):
    """The destroy call itself is never interrupted, but a second SIGTERM ends the retries after it."""
    runpod.faults.append(Fault("DELETE", r"/pods/\w+", 400, times=10**6, body={"error": "injected"}))
    runpod.refuse_terminate = True
    proc = start_run(make_spec(tmp_path), "runpod", env_for(runpod, LORAPOD_JOB_COMMAND=fake_command_template(0.02)),
                     *PATIENT_WATCHDOG)
    try:
        wait_for(lambda: any(r.state == "destroying" for r in Ledger().instances()), 60, "teardown", every=0.1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 15  # not the 300 s destroy deadline
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    runpod.faults.clear()
    runpod.refuse_terminate = False
    assert cli("down", Ledger().jobs()[0].id, env=env_for(runpod)).returncode == 0
    assert_nothing_bills(runpod, Ledger())


def test_vast_key_attach_failure_never_loses_the_instance(sshd_factory, remote_root, tmp_path):
    """The key attach fails and so do the first destroys: the instance is in the ledger, destroyed
    with confirmation, and the next offer runs the job."""
    from lorapod.compute.vast.api import VastApi
    from lorapod.compute.vast.provider import VastProvider

    from .fakes.vast_fake import VastFake

    fake = VastFake(sshd_factory, remote_root)
    try:
        fake.faults += [Fault("POST", r"/api/v0/instances/\d+/ssh/", 500, times=3),
                        Fault("DELETE", r"/api/v0/instances/\d+/", 500, times=3)]
        prov = VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10, retries=2))
        spec = make_spec(tmp_path)
        ledger = Ledger()
        summary = run_remote(load_spec(spec), prov, "vast", fast_options(job_command=fake_command(0.02)), ledger,
                             str(spec), say=lambda m: None)
        assert summary.state == "done", summary.message
        first, second = ledger.instances()
        assert first.provider_id == "70001" and first.state == "destroyed"
        assert second.state == "destroyed"
        assert fake.live() == [] and ledger.instances(live_only=True) == [] and fake.violations == []
    finally:
        fake.close()


# ----------------------------------------------------------------------------- ownership


def test_two_homes_on_one_account_never_sweep_each_other(runpod, tmp_path, monkeypatch):
    for k, v in env_for(runpod).items():
        if k.startswith(("RUNPOD", "LORAPOD_RUNPOD")):
            monkeypatch.setenv(k, v)
    homes = {}
    for name in ("a", "b"):
        monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / name))
        ledger = Ledger()
        ledger.job_started(f"job-{name}", str(tmp_path / name / "run"), "runpod", "runpod", None, None, None)
        ledger.job_ended(f"job-{name}", "failed", "controller gone")  # its instance is an orphan: of its own home
        iid = ledger.instance_creating("runpod", f"job-{name}", 0.22, "RTX 3090")
        pod = provider(runpod).create(RTX3090, InstanceSpec(f"job-{name}", KEY, name=instance_label(iid, f"job-{name}")))
        ledger.instance_created(iid, pod.id)
        homes[name] = (ledger, pod.id)
    # b's ledger forgets its row (a crash in create): b still sweeps only what carries b's id
    homes["b"][0]._db.execute("DELETE FROM instances")
    counts = down_orphans(homes["b"][0], say=lambda m: None)
    assert counts["unknown_destroyed"] == 1 and counts["others_left"] == 1
    assert [i.id for i in runpod.live()] == [homes["a"][1]]
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "a"))
    # widening the sweep to other installations asks first; "no" destroys nothing
    asked = subprocess.run([*cli_argv(), "down", "--orphans", "--all-installations"], input="n\n", text=True,
                           capture_output=True, env=cli_env(LORAPOD_HOME=str(tmp_path / "b")), timeout=60)
    assert asked.returncode != 0 and "other machines'" in asked.stderr and "nothing destroyed" in asked.stderr
    assert [i.id for i in runpod.live()] == [homes["a"][1]]
    counts = down_orphans(homes["a"][0], say=lambda m: None)
    assert counts["destroyed"] == 1
    assert_nothing_bills(runpod, homes["a"][0])


# ----------------------------------------------------------------------------- resume


def test_resume_records_its_controller_and_refuses_a_second(tmp_path):
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.05, "--fail-at 5"))
    spec = make_spec(tmp_path, max_steps=40, every=2)
    first = cli("run", str(spec), "--on", "local", "--python", sys.executable, "--poll-s", "0.2",
                "--watchdog-poll-s", "0.2", env=env, timeout=90)
    assert first.returncode == 1, first.stderr
    job = Ledger().jobs()[0].id
    # slow enough that the sweep and the second resume, each a CLI start on a loaded machine, come while it runs
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.8))  # ~29 s left: room for two CLI starts under load
    proc = subprocess.Popen([*cli_argv(), "run", "--resume", job, "--python", sys.executable, "--poll-s", "0.2",
                             "--watchdog-poll-s", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_for(lambda: (Ledger().job(job).last_step or 0) >= 6, 60, "the resumed job to run")
        sweep = cli("down", "--orphans", "--json", env=env)
        assert sweep.returncode == 0 and json.loads(sweep.stdout)["destroyed"] == 0, sweep.stderr
        second = cli("run", "--resume", job, "--python", sys.executable, env=env)
        assert second.returncode != 0 and "still running" in second.stderr
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    ledger = Ledger()
    assert ledger.job(job).state == "done" and ledger.job(job).last_step == 40
    assert ledger.instances(live_only=True) == []
    assert len(ledger.job_instances(job)) == 2  # one rental per controller, never two at once


# ----------------------------------------------------------------------------- a hostile host


HOSTILE_JOB = r"""
import json, os, pathlib, pickle, sys
run = pathlib.Path(sys.argv[1])
(run / "checkpoints" / "step-1").mkdir(parents=True, exist_ok=True)
os.symlink("/etc/passwd", run / "passwd")
os.symlink("/", run / "root")
os.symlink(sys.argv[2], run / "events.log")
os.mkfifo(run / "trap.fifo")
os.mkfifo(run / "checkpoints" / "step-1" / "rng.fifo")

class Boom:
    def __reduce__(self):
        return (open, (sys.argv[3], "w"))

ck = run / "checkpoints" / "step-1"
(ck / "optimizer.pt").write_bytes(pickle.dumps(Boom()))
(ck / "state.json").write_text(json.dumps({"step": 1}))
(ck / "adapter.safetensors").write_bytes(b"")
files = {p.name: p for p in ck.iterdir() if p.is_file() and not p.is_symlink() and p.name.endswith((".pt", ".json", ".safetensors"))}
import hashlib
(ck / "manifest.json").write_text(json.dumps({n: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for n, p in files.items()}))
with open(run / "metrics.jsonl", "a") as fh:
    fh.write(json.dumps({"step": 1, "loss": 1.0}) + "\n")
"""


def test_hostile_job_cannot_reach_this_machine(sshd, tmp_path):
    """Symlinks (to /etc/passwd, to /, to a file of ours), FIFOs and a pickle in the run folder over
    the real sshd: none of it lands here as a link or a FIFO, the pickle never runs, and the
    controller does not hang on the FIFO."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    pwned = tmp_path / "pwned"
    job = tmp_path / "hostile.py"
    job.write_text(HOSTILE_JOB)
    env = cli_env(LORAPOD_JOB_COMMAND=f"{{python}} {job} {{run_dir}} {victim} {pwned}")
    t0 = time.monotonic()
    out = cli("run", str(make_spec(tmp_path)), "--on", sshd.target, "--identity", str(sshd.client_key),
              "--python", sys.executable, "--poll-s", "0.2", "--watchdog-poll-s", "0.2", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 60
    ledger = Ledger()
    run_dir = Path(ledger.jobs()[0].run_dir)
    odd = [p for p in run_dir.rglob("*") if p.is_symlink() or not (p.is_file() or p.is_dir())]
    assert odd == []
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step-1").iterdir()) == [
        "adapter.safetensors", "manifest.json", "optimizer.pt", "state.json"]
    # `lorapod train --resume` on this folder: the planted pickle is refused, never run
    from lorapod.engine.checkpoint import CheckpointManager
    from lorapod.errors import CheckpointError
    from lorapod.rundir import RunDir

    ck = CheckpointManager(run_dir / "checkpoints").latest()
    assert ck is not None
    with pytest.raises(CheckpointError, match="cannot be read safely"):
        ck.optimizer()
    assert not pwned.exists()
    RunDir(run_dir).event("resumed")
    assert victim.read_text() == "mine\n"
    assert ledger.instances(live_only=True) == [] and list(sshd.work_root.iterdir()) == []


def test_logs_are_never_appended_through_a_planted_link(tmp_path):
    from lorapod.rundir import RunDir

    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    run = RunDir.create(tmp_path / "runs", "x")
    os.symlink(victim, run.events_file)
    run.event("hello")
    assert victim.read_text() == "mine\n"
    assert not run.events_file.is_symlink() and "hello" in run.events_file.read_text()


def test_checkpoints_hold_no_pickle(tmp_path):
    import torch

    from lorapod.engine.checkpoint import CheckpointManager, TrainState

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    path = CheckpointManager(tmp_path).save(TrainState(step=1), dict(model.state_dict()),
                                            {"optimizer": opt.state_dict()})
    assert sorted(p.name for p in path.iterdir()) == [
        "adapter.safetensors", "manifest.json", "optimizer.json", "optimizer.safetensors", "rng.json",
        "rng.safetensors", "state.json"]
    for p in path.glob("*.json"):  # plain JSON, and the tensors load with safetensors: no pickle anywhere
        json.loads(p.read_text())
    back = CheckpointManager(tmp_path).latest().optimizer()["optimizer"]
    assert torch.equal(back["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_ssh_host_honours_your_known_hosts(sshd, tmp_path, monkeypatch):
    """An ssh:// host whose key contradicts ~/.ssh/known_hosts is refused before anything runs."""
    from lorapod.compute.ssh import SSHProvider
    from lorapod.errors import RemoteError

    from .conftest_ssh import keygen

    other = keygen(tmp_path / "impostor").with_suffix(".pub").read_text().split()
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    monkeypatch.setenv("HOME", str(home))
    spec = make_spec(tmp_path)
    prov = SSHProvider(sshd.target, identity=sshd.client_key)
    with pytest.raises(RemoteError, match="host key changed"):
        run_remote(load_spec(spec), prov, sshd.target, fast_options(identity=sshd.client_key), Ledger(), str(spec),
                   say=lambda m: None)
    assert Ledger().instances(live_only=True) == [] and list(sshd.work_root.iterdir()) == []


def test_a_skipped_damaged_checkpoint_is_said_on_the_terminal(tmp_path):
    """Issue 22 item 8: resuming past a cut-off newest checkpoint went on from the one before it
    in silence; now the terminal (and events.log) names the one skipped."""
    import torch

    from lorapod.engine.checkpoint import CheckpointManager, TrainState, resume_point

    model = torch.nn.Linear(3, 2)
    mgr = CheckpointManager(tmp_path)
    for step in (4, 8):
        mgr.save(TrainState(step=step), dict(model.state_dict()), {})
    (tmp_path / "step-8" / "adapter.safetensors").write_bytes(b"cut")
    events: list[str] = []
    said: list[str] = []
    ck = resume_point(tmp_path, events.append, said.append)
    assert ck is not None and ck.state.step == 4
    skipped = "skipped checkpoint step-8: its files do not match its manifest.json (cut off or damaged)"
    assert said[0] == skipped and said[1:] == ["resuming from step-4 (step 4, epoch 0)"]  # then where it resumed
    assert events[0] == skipped
