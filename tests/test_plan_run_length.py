"""The plan says when a run is too short for its own settings (issue 48, F16): few optimizer
steps, and eval / save / sample intervals or a warmup the run never reaches."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def _job(name: str, *sets: str, **kw):
    from lorapod.plan.job import build_job
    from lorapod.spec import load_spec

    return build_job(load_spec(EX / name, list(sets)), **kw)


def test_the_chat_example_on_its_stand_in_data_says_its_run_is_short():
    job = _job("llm-chat-lora.yaml")  # 1,350 short chats packed into 23 micro-batches: 6 optimizer steps
    n = job.optimizer_steps
    assert n < 50
    said = "\n".join(job.warnings)
    assert f"only {n} optimizer steps ({job.steps} micro-batches / train.grad_accum 4)" in said
    assert f"eval.every_steps=50 is longer than the run's {n} optimizer steps" in said
    assert f"save.every_steps=100 is longer than the run's {n} optimizer steps" in said
    assert "(with the assumed" not in said  # counted from the data


def test_a_run_long_enough_for_its_intervals_says_nothing_of_them():
    job = _job("sdxl-object-lora.yaml", images=25)  # 2,000 steps, save and sample every 2 of 8 epochs
    said = "\n".join(job.warnings)
    assert "optimizer step" not in said and "every_" not in said and "warmup" not in said


def test_epoch_intervals_and_warmup_beyond_the_run_and_the_assumed_count_is_named(tmp_path):
    job = _job("sdxl-object-lora.yaml", f"data.path={tmp_path / 'absent'}", "train.epochs=1", "data.repeats=1",
               "save.every_epochs=2", "samples.every_epochs=3", "train.warmup_steps=100")
    said = "\n".join(job.warnings)
    assert "only 25 optimizer steps (25 micro-batches; with the assumed 25 images)" in said
    assert "save.every_epochs=2 is more than the run's 1 epoch: no checkpoint before the end" in said
    assert "samples.every_epochs=3 is more than the run's 1 epoch: no samples while training" in said
    assert "the warmup (100 steps) covers the whole run of 25 optimizer steps (with the assumed 25 images)" in said
