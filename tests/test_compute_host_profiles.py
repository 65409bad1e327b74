"""`lorapod run examples/demo.yaml` on loopback hosts shaped like the images lorapod really rents
(tests/host_profiles.py): no rsync (installed with apt-get, or files moved with tar), Python only
under a conda prefix and off the SSH PATH, ``python`` vs ``python3``, variables only in PID 1's
environment. The real CLI and a real sshd; the job is the stand-in trainer (tests/fake_trainer.py,
same run-folder contract, seconds not a minute), except in the one slow test that trains the
real demo under the hardest profile. Nothing may be left running."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lorapod.store.ledger import Ledger

from .conftest_ssh import new_sshd, require_tools
from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake
from .host_profiles import PROFILES, build
from .remote_helpers import REPO, cli_argv, cli_env, fake_command_template

FAST = ["--poll-s", "0.3", "--pull-every-s", "1", "--ready-deadline-s", "30", "--stop-margin-s", "1",
        "--stop-wait-s", "20", "--reconnect-s", "30", "--watchdog-poll-s", "0.5"]


@pytest.fixture
def profile_host(tmp_path_factory, remote_root):
    """make(profile name) -> (sshd, host) on loopback; both stopped at the end."""
    require_tools("sshd", "ssh", "ssh-keygen", "rsync")
    made = []

    def make(name: str):
        d = tmp_path_factory.mktemp(name[:20])
        host = build(PROFILES[name], d / "image")
        made.append(host)
        sshd = new_sshd(d / "sshd", remote_root, host.sshd_config)
        made.append(sshd)
        return sshd, host

    yield make
    for thing in reversed(made):
        thing.stop()


def demo_run(sshd, run_dir: Path, *extra: str, real: bool = False) -> subprocess.CompletedProcess:
    """The demo, four steps, no --python: the interpreter is the host's to find."""
    argv = [*cli_argv(), "run", str(REPO / "examples" / "demo.yaml"), "--on", sshd.target,
            "--identity", str(sshd.client_key), "--json", *FAST,
            "--set", "train.max_steps=4", "--set", "save.every_steps=2", "--set", "eval.every_steps=4",
            "--set", f"output.dir={run_dir}", *extra]
    env = cli_env()
    env.pop("LORAPOD_JOB_COMMAND", None)
    if not real:
        env["LORAPOD_JOB_COMMAND"] = fake_command_template(0.05)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


def events(summary: dict) -> str:
    return (Path(summary["run_dir"]) / "remote-events.log").read_text()


def alive_under(path: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(path)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def assert_done_and_clean(proc: subprocess.CompletedProcess, sshd, real: bool = False) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["state"] == "done" and summary["last_step"] == 4, summary
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    assert "final pull verified" in events(summary)
    assert list(sshd.work_root.iterdir()) == [], list(sshd.work_root.iterdir())
    assert alive_under(sshd.work_root) == []
    assert Ledger().instances(live_only=True) == []
    return summary


def test_no_rsync_root_with_apt_installs_it_and_the_demo_runs(profile_host, tmp_path):
    sshd, host = profile_host("runpod-pytorch-2.8.0-py3.11")
    summary = assert_done_and_clean(demo_run(sshd, tmp_path / "runs"), sshd)
    log = events(summary)
    assert "rsync was missing; installed it with apt-get" in log, log
    assert (Path(host.session_path) / "rsync").is_symlink()  # what the apt-get stand-in did


def test_no_rsync_and_no_mirror_moves_files_with_tar(profile_host, tmp_path):
    sshd, host = profile_host("no-rsync-no-mirror")
    summary = assert_done_and_clean(demo_run(sshd, tmp_path / "runs"), sshd)
    log = events(summary)
    assert "rsync is not on the instance (apt-get could not install it): files move with tar" in log, log
    assert not (Path(host.session_path) / "rsync").exists()
    run_dir = Path(summary["run_dir"])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2", "step-4"]
    # what only this machine writes stayed this machine's (the pull excludes them, as rsync's did)
    assert str(sshd.work_root) not in (run_dir / "spec.yaml").read_text()


def test_python_only_under_a_conda_prefix_off_the_ssh_path(profile_host, tmp_path):
    sshd, host = profile_host("pytorch-pytorch-on-vast")
    summary = assert_done_and_clean(demo_run(sshd, tmp_path / "runs"), sshd)
    log = events(summary)
    conda = host.image_python
    assert (f"Python on the instance: {conda} (Python 3." in log
            and "on PID 1's PATH (the image's ENV PATH), which the SSH session does not get" in log), log
    assert "the image has everything; installed nothing" in log  # envsetup ran under it
    assert f"job started on the instance: {conda} " in log
    assert "watchdog started on the instance" in log and "running, pid " in log


def test_python_not_python3_picks_the_one_with_torch(profile_host, tmp_path):
    sshd, host = profile_host("runpod-base-python-vs-python3")
    summary = assert_done_and_clean(demo_run(sshd, tmp_path / "runs"), sshd)
    log = events(summary)
    assert f"Python on the instance: {host.image_python} (Python 3." in log, log
    assert "passed over " in log and "python3 (Python 3." in log and "without torch" in log
    assert "the image has everything; installed nothing" in log



def test_a_python_that_is_not_there_is_named_before_anything_starts(profile_host, tmp_path):
    """(A host with no Python at all cannot be modelled on loopback: this machine's own
    /usr/bin/python3 is one of the known places. choose() is unit-tested for that case.)"""
    sshd, _ = profile_host("runpod-base-python-vs-python3")
    proc = demo_run(sshd, tmp_path / "runs", "--python", "/opt/nowhere/bin/python3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--python /opt/nowhere/bin/python3 cannot run lorapod (found: no executable file" in proc.stderr
    (job,) = Ledger().jobs()
    assert job.state == "failed" and "cannot run lorapod" in (job.summary or "")
    assert "watchdog started" not in events({"run_dir": job.run_dir})
    assert list(sshd.work_root.iterdir()) == [] and Ledger().instances(live_only=True) == []


@pytest.mark.slow
def test_the_real_demo_trains_on_the_conda_image_without_rsync(profile_host, tmp_path):
    """The real engine (not the stand-in) under pytorch/pytorch's facts: ~45 s on two cores."""
    sshd, host = profile_host("pytorch-pytorch-on-vast")
    summary = assert_done_and_clean(demo_run(sshd, tmp_path / "runs", real=True), sshd, real=True)
    log = events(summary)
    assert f"job started on the instance: {host.image_python} -m lorapod train" in log
    assert "files move with tar over the SSH connection" in log


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


def _cloud_run(fake_env: dict, target: str, run_dir: Path, *extra: str) -> subprocess.Popen:
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.25), **fake_env)
    return subprocess.Popen([*cli_argv(), "run", str(REPO / "examples" / "demo.yaml"), "--on", target, "--json",
                             "--poll-s", "0.2", "--pull-every-s", "0.5", "--ready-deadline-s", "30",
                             "--watchdog-poll-s", "0.3", "--set", "train.max_steps=10", "--set", "save.every_steps=2",
                             "--set", f"output.dir={run_dir}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_provider_variables_only_in_pid1_the_watchdog_still_deletes_the_pod(sshd_factory, remote_root, tmp_path):
    """RunPod's variables live in PID 1's environment, not the SSH session's (runpod-python reads
    /proc/1/environ for that reason): with the controller SIGKILLed, the watchdog must still find
    RUNPOD_POD_ID and the pod-scoped key there and delete the pod from inside."""
    fake = RunPodFake(sshd_factory, remote_root, host_profile=PROFILES["provider-vars-in-pid1"])
    env = {"RUNPOD_API_KEY": fake.account_key, "LORAPOD_RUNPOD_URL": fake.url,
           "LORAPOD_RUNPOD_GRAPHQL_URL": fake.graphql_url}
    try:
        proc = _cloud_run(env, "runpod", tmp_path / "runs", "--heartbeat-timeout-s", "2")
        try:
            _wait(lambda: (Ledger().jobs() or [None])[0] is not None and (Ledger().jobs()[0].last_step or 0) >= 3,
                  60, "step 3")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        (inst,) = fake.instances.values()
        (host,) = fake._hosts
        assert "RUNPOD_POD_ID" not in host.sshd_config and "RUNPOD_API_KEY" not in host.sshd_config
        _wait(lambda: not fake.live(), 30, "the watchdog to delete the pod")
        assert inst.deleted_by == "pod-scoped key"  # from inside, with what PID 1 holds
        down = subprocess.run([*cli_argv(), "down", "--orphans", "--json"], capture_output=True, text=True,
                              env=cli_env(**env), timeout=60)
        assert down.returncode == 0 and json.loads(down.stdout)["reconciled"] == 1, down.stderr
        assert Ledger().instances(live_only=True) == []
        assert fake.running_processes() == [] and list(remote_root.iterdir()) == []
        assert fake.violations == [], fake.violations
    finally:
        fake.close()


def test_the_vast_fake_on_pytorch_pytorch_facts_runs_the_demo(sshd_factory, remote_root, tmp_path):
    """Through the Vast fake, on an instance with pytorch/pytorch's facts: no rsync, Python only
    in the conda prefix on PID 1's PATH, the container's variables in PID 1 only."""
    fake = VastFake(sshd_factory, remote_root, host_profile=PROFILES["pytorch-pytorch-on-vast"])
    env = {"VAST_API_KEY": fake.account_key, "LORAPOD_VAST_URL": fake.url}
    try:
        proc = _cloud_run(env, "vast", tmp_path / "runs", "--set", "train.max_steps=4")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        summary = json.loads(out)
        assert summary["state"] == "done" and summary["last_step"] == 4
        log = events(summary)
        (host,) = fake._hosts
        assert f"Python on the instance: {host.image_python} (Python 3." in log
        assert "files move with tar over the SSH connection" in log and "final pull verified" in log
        assert fake.live() == [] and fake.running_processes() == [] and list(remote_root.iterdir()) == []
        assert Ledger().instances(live_only=True) == [] and fake.violations == [], fake.violations
    finally:
        fake.close()
