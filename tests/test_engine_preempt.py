"""A preemption's SIGTERM on the instance: the job saves the last whole step and exits 75 (preempted,
saved), and the resume continues bit-exactly (issue 36, item 2). The signal reaches the job through
job.sh and, on a spot pod, through the container's init (compute/remote.py SPOT_INIT)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.compute.remote import JOB_SH, SPOT_INIT, spot_init_args
from lorapod.engine.checkpoint import CheckpointManager, resume_point
from lorapod.engine.llm import train_llm
from lorapod.engine.metrics import read_metrics
from lorapod.errors import PREEMPTED_EXIT
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .llm_fixtures import make_assets, spec_dict

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("llm"))


def _run(assets, where: Path, **train):
    _root, model_dir, tr, va = assets
    raw = spec_dict(model_dir, tr, va, where / "runs", **train)
    raw["save"] = {"every_steps": 1000, "every_epochs": None, "keep_last": 10}  # only the SIGTERM saves
    raw["eval"] = {"every_steps": 1000, "max_batches": 1, "at_start": False}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def _quiet(**kw):
    return train_llm(device="cpu", show_progress=False, log=lambda m: None, **kw)


def _losses(run: RunDir) -> list[float]:
    return [r["loss"] for r in read_metrics(run.metrics_file) if "loss" in r]


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory):
    spec, run = _run(assets, tmp_path_factory.mktemp("straight"), max_steps=8)
    return _quiet(spec=spec, run=run).result.losses


def test_sigterm_saves_the_step_it_finishes_and_the_resume_is_bit_exact(assets, tmp_path, straight):
    from lorapod.engine.loop import Interrupted

    spec, run = _run(assets, tmp_path, max_steps=8)

    def term(state, loss):
        if state.step == 3:
            signal.raise_signal(signal.SIGTERM)  # the handler only sets a flag: step 3 is finished first

    with pytest.raises(Interrupted) as got:
        _quiet(spec=spec, run=run, on_step=term)
    assert got.value.how == "SIGTERM" and got.value.exit_code == PREEMPTED_EXIT == 75
    assert got.value.step == 3 and CheckpointManager(run.checkpoints).latest().state.step == 3
    resumed = _quiet(spec=spec, run=run, resume=True).result.losses
    assert resumed == straight[3:]  # bit-exact, not approx
    assert _losses(run) == straight


def test_sigterm_in_the_middle_of_an_accumulation_window_drops_the_window(assets, tmp_path, straight, monkeypatch):
    """grad_accum 2: a SIGTERM during the window's first micro-batch stops before its second one;
    the checkpoint is the step before, the window is done again on resume."""
    import lorapod.engine.loop as loop
    from lorapod.engine.loop import Interrupted

    spec, run = _run(assets, tmp_path, max_steps=8)
    real = loop._train_window
    calls = {"n": 0}

    def window(recipe, *a, **kw):
        inner = recipe.loss

        def loss(batch):
            calls["n"] += 1
            if calls["n"] == 2 * 4 + 1:  # the first micro-batch of step 5
                signal.raise_signal(signal.SIGTERM)
            return inner(batch)

        recipe.loss = loss
        try:
            return real(recipe, *a, **kw)
        finally:
            del recipe.loss

    monkeypatch.setattr(loop, "_train_window", window)
    with pytest.raises(Interrupted) as got:
        _quiet(spec=spec, run=run)
    assert calls["n"] == 9  # the window's second micro-batch never ran
    assert got.value.step == 4 and CheckpointManager(run.checkpoints).latest().state.step == 4
    monkeypatch.setattr(loop, "_train_window", real)
    assert _quiet(spec=spec, run=run, resume=True).result.losses == straight[4:]


def test_a_ctrl_c_after_the_optimizer_stepped_waits_for_the_step_to_be_counted(assets, tmp_path, straight, monkeypatch):
    """Before: a Ctrl-C landing between the optimizer's step and the step count saved step k+1's
    weights labelled k, and the resume trained that step twice."""
    import lorapod.engine.loop as loop
    from lorapod.engine.loop import Interrupted

    spec, run = _run(assets, tmp_path, max_steps=8)
    real = loop.build_optimizer
    steps = {"n": 0}

    def build(*a, **kw):
        opt = real(*a, **kw)

        def stepped(optimizer, args, kwargs):
            steps["n"] += 1
            if steps["n"] == 3:  # the optimizer has stepped for step 3; the loop has not counted it
                signal.raise_signal(signal.SIGINT)

        opt.register_step_post_hook(stepped)
        return opt

    monkeypatch.setattr(loop, "build_optimizer", build)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted) as got:
            _quiet(spec=spec, run=run)
    finally:
        signal.signal(signal.SIGINT, old)
    assert got.value.how == "Ctrl-C" and got.value.exit_code == 130 and got.value.step == 3
    monkeypatch.setattr(loop, "build_optimizer", real)
    assert _quiet(spec=spec, run=run, resume=True).result.losses == straight[3:]


@pytest.mark.timeout(900)
def test_a_real_training_process_sigtermed_mid_run_exits_75_and_resumes_exactly(assets, tmp_path, straight):
    """``lorapod train`` in its own process, SIGTERM once it has logged step 2: exit 75 with a
    checkpoint; a checkpoint cut off mid-write beside it (a temporary folder, a step folder without
    its manifest) is never the one resumed from; the resume's losses are the straight run's."""
    spec, run = _run(assets, tmp_path, max_steps=8)
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen([sys.executable, "-m", "lorapod", "train", "--run-dir", str(run.root), str(run.spec_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    # waits on the condition (step 2 logged), with a bound generous enough for a busy 2-core machine
    # where importing torch alone can take a minute: a SIGTERM sent before the handler is installed
    # kills the process (-15) instead of testing the save (a 45 s bound did that under load)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and len(_losses(run) if run.metrics_file.exists()
                                                                      else []) < 2:
        time.sleep(0.05)
    assert proc.poll() is None and len(_losses(run)) >= 2, "the run never logged step 2 while running"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    text = out.decode(errors="replace")
    assert proc.returncode == PREEMPTED_EXIT, text[-2000:]
    latest = CheckpointManager(run.checkpoints).latest()
    assert latest is not None and f"interrupted (SIGTERM) at step {latest.state.step}; checkpoint saved" in text
    k = latest.state.step
    assert 2 <= k < 8
    # what a SIGKILL in the middle of a later save leaves: never resumed from
    cut = run.checkpoints / f".tmp-step-{k + 1}-4242"
    cut.mkdir()
    (cut / "adapter.safetensors").write_bytes(b"\0" * 100)
    half = run.checkpoints / f"step-{k + 2}"
    half.mkdir()
    (half / "state.json").write_text(json.dumps({"step": k + 2}))
    said: list[str] = []
    assert resume_point(run.checkpoints, said.append, said.append).path.name == f"step-{k}"
    assert any(f"skipped checkpoint step-{k + 2}" in m for m in said)
    import shutil

    shutil.rmtree(half)
    assert _quiet(spec=spec, run=run, resume=True).result.losses == straight[k:]
    assert _losses(run) == straight


# ----------------------------------------------------------------------------- the signal's way in

STANDIN = """import pathlib, signal, sys, time
def term(*a):
    time.sleep(0.4)  # a save that takes a while
    pathlib.Path('saved').write_text('saved')
    sys.exit(75)
signal.signal(signal.SIGTERM, term)
pathlib.Path('ready').write_text('ready')
while True:
    time.sleep(0.05)
"""


def _wait(cond, timeout: float = 120.0) -> bool:  # a bound for a busy machine; returns once cond holds
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_the_spot_init_as_pid_1_passes_sigterm_to_the_job_and_waits_for_its_save(tmp_path):
    """On a spot pod the preemption's SIGTERM goes to PID 1 only (docker stop): lorapod's init sends
    it to each job.sh, job.sh to the trainer, and the init stays until the job has saved and
    written job.exit (75), since the container ends with PID 1."""
    work, jobs = tmp_path / "work", tmp_path / "jobs"
    work.mkdir()
    (work / "job.sh").write_text(JOB_SH)
    env = dict(os.environ, LORAPOD_JOBS_DIR=str(jobs))
    # the container's command, as the provider gets it; the image's start is a stand-in sleep
    argv = shlex.split(spot_init_args("sleep 300"))
    assert argv[:2] == ["sh", "-c"] and len(argv) == 3 and " " not in argv[2]
    init = subprocess.Popen(argv, env=env, start_new_session=True)
    job = subprocess.Popen(["setsid", "bash", str(work / "job.sh"), sys.executable, "-c", STANDIN], cwd=work, env=env)
    try:
        assert _wait(lambda: (work / "ready").exists() and any(jobs.iterdir()))
        init.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert init.poll() is None  # still there while the job saves
        assert init.wait(timeout=120) == 0
        assert (work / "saved").read_text() == "saved"
        assert (work / "job.exit").read_text().strip() == str(PREEMPTED_EXIT)
        assert not any(jobs.iterdir())  # job.sh took its name away
    finally:
        for p in (init, job):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _start_job_sh(tmp_path: Path) -> tuple[Path, subprocess.Popen]:
    """job.sh (compute/remote.py) running the stand-in in its own process group, as the session
    starts it; the work folder and the process."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.sh").write_text(JOB_SH)
    env = dict(os.environ, LORAPOD_JOBS_DIR=str(tmp_path / "jobs"))
    job = subprocess.Popen(["bash", str(work / "job.sh"), sys.executable, "-c", STANDIN], cwd=work, env=env,
                           start_new_session=True)
    return work, job


def test_job_sh_records_the_jobs_own_status_when_it_is_sigtermed_directly(tmp_path):
    """The watchdog and teardown signal the whole process group: job.sh's trap must not turn the
    job's 75 into 143 (bash's status for a wait the trap cut short)."""
    work, job = _start_job_sh(tmp_path)
    assert _wait(lambda: (work / "ready").exists())
    os.killpg(job.pid, signal.SIGTERM)
    job.wait(timeout=120)
    assert (work / "job.exit").read_text().strip() == "75"


def test_the_spot_init_script_runs_the_images_start():
    assert "{start} &" in SPOT_INIT
    import base64

    arg = shlex.split(spot_init_args("/start.sh"))[2]
    b64 = arg.split("echo${IFS}", 1)[1].split("|", 1)[0]
    assert "\n/start.sh &\n" in base64.b64decode(b64).decode()


def test_the_watchdog_records_its_reason_when_job_sh_wrote_the_jobs_status_first(tmp_path, monkeypatch):
    """job.sh passes the watchdog's SIGTERM on and records the job's 75: job.exit must still say
    the watchdog stopped it and why (the controller reports that), not a bare exit code."""
    from lorapod.compute import watchdog

    work, job = _start_job_sh(tmp_path)
    try:
        assert _wait(lambda: (work / "ready").exists() and (work / "job.pid").exists())
        monkeypatch.chdir(work)
        monkeypatch.setattr(watchdog, "log", lambda msg: None)
        watchdog.kill_job("the dollar cap is near")
        job.wait(timeout=120)
        assert (work / "saved").exists()  # it saved on the SIGTERM
        assert (work / "job.exit").read_text() == "killed: the dollar cap is near (the job exited 75)\n"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
