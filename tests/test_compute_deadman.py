"""The dead man's switch (compute/deadman.py; issue 46, item 2): a controller SIGKILLed at any
moment between the create and the bootstrap leaves nothing billing a few seconds (the switch's
window, made tiny here) after the instance's container started, with no user command: on the
RunPod and the Vast.ai fakes, for ``lorapod run`` (on-demand and spot), ``lorapod sweep`` and
``lorapod doctor``. The fakes run the start command the create names when the container starts,
with the instance's variables only (its scoped key among them), and give the scoped keys exactly
the permissions the providers document (tests/fakes/runpod_fake.py, vast_fake.py).

Kill points: the create's answer still in flight (the provider acted on it), the instance booting
(its image pull), SSH answering before the watchdog runs, and the watchdog running before the
bootstrap (the switch disarmed: the watchdog's own heartbeat rule destroys it then). Every wait is
on the fake's state or the controller's own output, bounded.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.compute.deadman import DeadMan
from lorapod.compute.runpod.api import RunPodApi

from .fakes.base import Fault, switch_tokens
from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake
from .remote_helpers import cli_argv, cli_env, fake_command_template, make_spec

#: the switch's window in the tests where the controller dies before SSH, and where it must reach
#: SSH first on a loaded machine
TINY_MIN, REACHABLE_MIN = 0.05, 0.5


@pytest.fixture(params=["runpod", "vast"])
def fake(request, sshd_factory, remote_root):
    f = (RunPodFake(sshd_factory, remote_root) if request.param == "runpod"
         else VastFake(sshd_factory, remote_root, key_delay_s=0.3))
    f.kind = request.param
    yield f
    f.close()


def env_for(fake) -> dict[str, str]:
    if fake.kind == "runpod":
        keys = {"RUNPOD_API_KEY": fake.account_key, "LORAPOD_RUNPOD_URL": fake.url,
                "LORAPOD_RUNPOD_GRAPHQL_URL": fake.graphql_url}
    else:
        keys = {"VAST_API_KEY": fake.account_key, "LORAPOD_VAST_URL": fake.url}
    return cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.2), **keys)


def scoped_key(fake) -> str:
    return "pod-scoped key" if fake.kind == "runpod" else "container key"


def create_path(fake) -> tuple[str, str, str]:
    """The create request (method, path regex, body text) of each fake, on-demand."""
    return ("POST", r"/pods", "") if fake.kind == "runpod" else ("PUT", r"/api/v0/asks/\d+/?", "")


class Controller:
    """``lorapod run`` (or sweep, doctor) as a process whose stderr is read line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.lines: list[str] = []
        self._buf = b""

    def _read(self, timeout: float) -> None:
        fd = self.proc.stderr.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if ready:
            chunk = os.read(fd, 65536)
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            self.lines += [x.decode(errors="replace") for x in done]

    def wait_line(self, text: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not any(text in x for x in self.lines):
            assert self.proc.poll() is None, "\n".join(self.lines[-30:])
            assert time.monotonic() < end, f"timed out waiting for {text!r}:\n" + "\n".join(self.lines[-30:])
            self._read(0.05)

    def wait(self, cond, what: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out: {what}\n" + "\n".join(self.lines[-30:])
            self._read(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def run_argv(spec: Path, fake, *extra: str) -> list[str]:
    return [*cli_argv(), "run", str(spec), "--on", fake.kind, "--python", sys.executable, "--deps", "none",
            "--poll-s", "0.2", "--ready-deadline-s", "60", "--watchdog-poll-s", "0.2", *extra]


def nothing_bills_soon(fake, after_s: float, by: str | None) -> None:
    """No instance left at the provider, no process of one, within the switch's window plus a
    generous margin for a loaded machine; destroyed from inside, by its own scoped key."""
    end = time.monotonic() + after_s + 90
    while fake.live() or fake.running_processes():
        assert time.monotonic() < end, f"still billing: {[(i.id, i.deleted) for i in fake.instances.values()]}"
        time.sleep(0.1)
    assert fake.instances, "nothing was created: the kill point was not reached"
    if by is not None:
        assert {i.deleted_by for i in fake.instances.values()} == {by}
    assert fake.violations == [], fake.violations


# ----------------------------------------------------------------------------- lorapod run

@pytest.mark.parametrize("moment", ["create in flight", "booting"])
def test_run_killed_before_ssh_leaves_nothing_billing(fake, tmp_path, moment):
    method, path, _ = create_path(fake)
    if moment == "create in flight":  # the provider acts on the create; its answer comes 30 s later
        fake.faults.append(Fault(method, path, 0, delay_s=30.0))
    else:
        fake.pull_s = 3.0  # the image pull: created, answered, not yet started
    spec = make_spec(tmp_path, deadman_min=TINY_MIN)
    c = Controller(run_argv(spec, fake), env_for(fake))
    try:
        if moment == "create in flight":
            c.wait(lambda: len(fake.instances) == 1, "the provider acting on the create")
        else:
            c.wait(lambda: bool(fake.instances) and fake.instances[next(iter(fake.instances))].pulling,
                   "the instance pulling its image")
        c.kill()
    finally:
        if c.proc.poll() is None:
            c.kill()
    nothing_bills_soon(fake, TINY_MIN * 60 + fake.pull_s, scoped_key(fake))
    (inst,) = fake.instances.values()
    (token,) = switch_tokens(inst.start_cmd or [])
    log = Path(f"/tmp/.lorapod-switch-{token}.log").read_text()
    assert "no controller reached this instance" in log and "Bearer" not in log


@pytest.mark.parametrize("moment", ["ssh answered", "watchdog running"])
def test_run_killed_after_ssh_leaves_nothing_billing(fake, tmp_path, moment):
    """SSH answers, then the probe, the watchdog, the switch disarmed: killed around that, the
    switch (not yet disarmed) or the watchdog (already running: its silent-controller rule)
    destroys the instance."""
    spec = make_spec(tmp_path, deadman_min=REACHABLE_MIN)
    c = Controller(run_argv(spec, fake, "--heartbeat-timeout-s", "3"), env_for(fake))
    try:
        c.wait_line("answers on" if moment == "ssh answered" else "dead man's switch disarmed")
        c.kill()
    finally:
        if c.proc.poll() is None:
            c.kill()
    nothing_bills_soon(fake, REACHABLE_MIN * 60, scoped_key(fake))


def test_spot_run_killed_while_renting_leaves_nothing_billing(sshd_factory, remote_root, tmp_path):
    """The case the issue names: a controller killed while it rents a spot pod (RunPod's GraphQL
    podRentInterruptable, the switch inside the init that is PID 1)."""
    fake = RunPodFake(sshd_factory, remote_root)
    fake.kind = "runpod"
    try:
        fake.faults.append(Fault("POST", r"/graphql", 0, delay_s=30.0, body_has="podRentInterruptable"))
        spec = make_spec(tmp_path, deadman_min=TINY_MIN)
        c = Controller(run_argv(spec, fake, "--spot", "always"), env_for(fake))
        try:
            c.wait(lambda: len(fake.instances) == 1, "the spot pod's create")
            c.kill()
        finally:
            if c.proc.poll() is None:
                c.kill()
        nothing_bills_soon(fake, TINY_MIN * 60, "pod-scoped key")
        assert all(p in fake.spot for p in fake.instances)
    finally:
        fake.close()


# ----------------------------------------------------------------------------- sweep and doctor

def test_sweep_killed_while_its_instances_boot_leaves_nothing_billing(fake, tmp_path):
    fake.pull_s = 3.0
    spec = make_spec(tmp_path, deadman_min=TINY_MIN)
    argv = [*cli_argv(), "sweep", str(spec), "--grid", "train.learning_rate=1e-3,3e-4", "--on", fake.kind,
            "--parallel", "2", "--python", sys.executable, "--poll-s", "0.2"]
    c = Controller(argv, env_for(fake))
    try:
        c.wait(lambda: len(fake.instances) == 2, "both jobs' instances created")
        c.kill()
    finally:
        if c.proc.poll() is None:
            c.kill()
    nothing_bills_soon(fake, TINY_MIN * 60 + fake.pull_s, scoped_key(fake))


def test_doctor_killed_before_its_instance_answers_leaves_nothing_billing(fake, tmp_path):
    fake.pull_s = 3.0
    argv = [*cli_argv(), "doctor", fake.kind, "--yes", "--deadman-min", str(TINY_MIN)]
    c = Controller(argv, env_for(fake))
    try:
        c.wait(lambda: bool(fake.instances), "the doctor's create")
        c.kill()
    finally:
        if c.proc.poll() is None:
            c.kill()
    nothing_bills_soon(fake, TINY_MIN * 60 + fake.pull_s, scoped_key(fake))


# ----------------------------------------------------------------------------- a controller that reaches it

def test_a_controller_that_reaches_the_instance_disarms_the_switch_and_the_job_runs_on(fake, tmp_path):
    """A window shorter than the job: once disarmed the switch never fires, the job ends done."""
    spec = make_spec(tmp_path, max_steps=30, deadman_min=REACHABLE_MIN)
    out = subprocess.run(run_argv(spec, fake, "--heartbeat-timeout-s", "60"), capture_output=True, text=True,
                         env=env_for(fake), timeout=300)
    err = " ".join(out.stderr.split())
    assert out.returncode == 0, err[-3000:]
    assert "dead man's switch disarmed" in err
    (inst,) = fake.instances.values()
    assert inst.deleted_by == "account key"  # the controller's own teardown, never the switch
    assert fake.live() == [] and fake.running_processes() == []


def test_the_switch_fits_vasts_onstart_and_carries_no_secret():
    """Vast.ai's ``onstart`` is at most 4048 characters (its OpenAPI's quirks); the switch carries
    the recipe's variable names, never a key's value."""
    from lorapod.compute.vast.api import VastApi
    from lorapod.compute.vast.provider import onstart_script

    for recipe in (RunPodApi("acct-secret").self_destroy_recipe(""), VastApi("acct-secret").self_destroy_recipe("")):
        launcher = DeadMan(600.0, recipe).launcher()
        assert len(onstart_script() + "; " + launcher) < 4048
        assert "acct-secret" not in launcher
