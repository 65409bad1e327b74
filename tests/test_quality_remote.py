"""train.stop_when on rented machines: the RunPod and Vast.ai fakes (tests/fakes cite the vendors) run the
stand-in trainer (tests/fake_trainer.py) with a scripted score per checkpoint, recorded and decided by
lorapod's own quality autopilot on the instance. When the curve plateaus the job ends normally at that
checkpoint: the controller pulls it, destroys the instance (confirmed, nothing left billing) and says the
minutes and dollars saved against the plan. On spot a preemption does not reset the count: the scores
live in the run folder, which the next instance continues from."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from lorapod.compute.session import run_remote
from lorapod.rundir import quality as files
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake
from .remote_helpers import fake_command, fast_options, make_spec
from .test_compute_spot import rp, va
from .test_compute_spot_recovery import assert_nothing_bills, newest_live

STEPS, EVERY, STEP_S = 40, 4, 0.15
# rises for three checkpoints, then within noise (se 0.002) for three: plateau: 3 stops at the 6th (step 24)
CURVE = "0.10,0.20,0.25,0.251,0.249,0.2515,0.30,0.35,0.40,0.45"
STOP_STEP = 24


@pytest.fixture
def vast(sshd_factory, remote_root):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.0)
    yield fake
    fake.close()


def scripted_spec(tmp_path: Path, **compute) -> Path:
    path = make_spec(tmp_path, max_steps=STEPS, every=EVERY, **compute)
    import yaml

    raw = yaml.safe_load(path.read_text())
    raw["train"]["stop_when"] = {"plateau": 3}
    path.write_text(yaml.safe_dump(raw))
    return path


def command(extra: tuple[str, ...] = ()):
    return fake_command(STEP_S, ("--scores", CURVE, "--device-name", "NVIDIA GeForce RTX 4090", *extra))


def check_stopped(summary, ledger: Ledger, fake, remote_root: Path) -> dict:
    assert summary.state == "done", summary.message  # ended normally, early
    assert summary.last_step == STOP_STEP, summary.message
    run = summary.run_dir
    stop = files.read_json(run, files.STOPPED)
    assert stop is not None and stop["step"] == STOP_STEP and stop["steps_saved"] == STEPS - STOP_STEP
    assert "plateau" in stop["reason"]
    # the seconds saved: the steps not run at the measured step time (the stand-in logs STEP_S)
    assert stop["seconds_saved"] == pytest.approx((STEPS - STOP_STEP) * STEP_S, rel=0.01, abs=0.5)
    scores = files.read_scores(run)
    assert [r["step"] for r in scores] == list(range(EVERY, STOP_STEP + 1, EVERY))  # each checkpoint scored once
    pick = files.read_json(run, files.PICK)
    assert pick["checkpoint"] == "step-12" and pick["autopilot"] == "on"  # the first of the plateau, within noise
    assert (run / "checkpoints" / f"step-{STOP_STEP}").is_dir()
    # pulled, destroyed, nothing billing; the dollars saved at the instance's own rate
    assert_nothing_bills(fake, ledger, remote_root)
    rate = [i.usd_per_hour for i in ledger.job_instances(summary.job_id)][-1]
    usd = stop["seconds_saved"] / 3600 * rate
    assert "saved against the plan" in summary.message and f"${usd:.2f}" in summary.message, summary.message
    assert "quality pick: step-12" in summary.message
    assert summary.to_dict()["quality"]["stopped"]["steps_saved"] == STEPS - STOP_STEP
    return stop


def test_runpod_plateau_stops_pulls_destroys_and_says_what_it_saved(runpod, tmp_path, remote_root):
    spec_path = scripted_spec(tmp_path)
    ledger = Ledger()
    summary = run_remote(load_spec(spec_path), rp(runpod), "runpod", fast_options(job_command=command()), ledger,
                         str(spec_path))
    check_stopped(summary, ledger, runpod, remote_root)
    assert runpod.violations == []


def test_vast_plateau_stops_pulls_destroys_and_says_what_it_saved(vast, tmp_path, remote_root):
    spec_path = scripted_spec(tmp_path)
    ledger = Ledger()
    summary = run_remote(load_spec(spec_path), va(vast), "vast", fast_options(job_command=command()), ledger,
                         str(spec_path))
    check_stopped(summary, ledger, vast, remote_root)


def test_a_preemption_does_not_reset_the_plateau_count(runpod: RunPodFake, tmp_path, remote_root):
    """Preempted after the plateau's first checkpoint was scored: the next spot instance resumes
    from the pulled run folder, its autopilot reads the scores so far, and the run stops at the same
    checkpoint as an uninterrupted one (a reset count would train three checkpoints longer).

    No race with a busy machine: the first instance's trainer stops at step HOLD (after step-16 was
    saved and scored) until it is preempted, and the preemption waits for step-16's score to reach
    home (the condition, polled, with a generous bound)."""
    spec_path = scripted_spec(tmp_path)
    hold = 18
    moments: list[int] = []
    failed: list[str] = []

    def first_attempt_holds(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
        held = () if resume else ("--hang-at", str(hold))  # the resumed run trains on
        return command(("--chain", *held))(python, spec, run_dir, resume)

    def preempt_once_scored_home() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            local = list((tmp_path / "runs").glob("*/quality/scores.jsonl"))
            scored = len(local[0].read_text().splitlines()) if local else 0
            if scored >= 4:  # step-16 scored and pulled home: 1 of the 3 plateau checkpoints
                moments.append(scored)
                runpod.preempt(newest_live(runpod), 0.5)
                return
            time.sleep(0.05)
        failed.append("step-16's score never reached home")

    watcher = threading.Thread(target=preempt_once_scored_home, daemon=True)
    watcher.start()
    ledger = Ledger()
    opts = fast_options(job_command=first_attempt_holds, spot=True, spot_policy="always", preempt_confirm_s=3.0,
                        spot_resume_wait_s=1.5, pull_every_s=0.3)
    summary = run_remote(load_spec(spec_path), rp(runpod), "runpod", opts, ledger, str(spec_path))
    watcher.join(timeout=5)
    assert not failed and moments == [4], (failed, moments, summary.message)
    assert len(runpod.instances) == 2  # preempted once, resumed on a second spot pod
    stop = check_stopped(summary, ledger, runpod, remote_root)
    assert stop["step"] == STOP_STEP
    events = [json.loads(e["message"]) for e in ledger.events(summary.job_id) if e["kind"] == "preemption"]
    assert len(events) == 1
