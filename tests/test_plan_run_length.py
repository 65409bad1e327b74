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


def _mug_folder(tmp_path: Path, good: int, broken: int) -> Path:
    from PIL import Image

    folder = tmp_path / "mug"
    folder.mkdir()
    for i in range(good):
        Image.new("RGB", (1024, 1024), (40 + 7 * i, 90, 160 - 3 * i)).save(folder / f"photo{i:02d}.jpg", quality=80)
        (folder / f"photo{i:02d}.txt").write_text(f"zxq_mug, a mug on a table number {i}")
    for i in range(broken):  # a JPEG cut short, and a text file named .png: neither decodes
        whole = (folder / "photo00.jpg").read_bytes()
        (folder / f"cut{i:02d}.jpg").write_bytes(whole[: len(whole) // 3])
        (folder / f"cut{i:02d}.txt").write_text("zxq_mug, a cut file")
    return folder


def test_plan_counts_only_the_images_that_decode_and_says_the_data_checks_errors(tmp_path):
    """Issue 48, F14: 20 photos and 3 cut-short files: 20 images are planned (the trainer skips
    or stops on the rest), and the plan says what `lorapod data check` finds."""
    pytest.importorskip("PIL")
    folder = _mug_folder(tmp_path, good=20, broken=3)
    job = _job("sdxl-object-lora.yaml", f"data.path={folder}")
    assert job.images == 20
    assert job.steps == 20 * 10 * 8  # images x repeats x epochs / batch 1
    said = "\n".join(job.warnings)
    assert f"`lorapod data check {folder}` finds 3 error(s)" in said
    assert "3 image(s) that do not decode are not counted" in said


def test_the_plans_data_check_uses_the_specs_trigger(tmp_path):
    """The spec's trigger word is checked as `data check --trigger` checks it (one finding per
    caption without it), so plan, run's pre-flight and the dashboard judge the data alike."""
    pytest.importorskip("PIL")
    from lorapod.data.check import check_path, spec_check_args
    from lorapod.spec import load_spec

    folder = _mug_folder(tmp_path, good=16, broken=0)
    (folder / "photo03.txt").write_text("a mug on a table, no trigger")
    spec = load_spec(EX / "sdxl-object-lora.yaml", [f"data.path={folder}"])
    args = spec_check_args(spec)
    assert args["family"] == "sdxl" and args["trigger"] == "zxq_mug"
    cli = check_path(folder, family="sdxl", trigger="zxq_mug")
    assert [f.to_dict() for f in check_path(folder, **args).findings] == [f.to_dict() for f in cli.findings]
    assert any(f.path == "photo03.txt" and "zxq_mug" in f.message for f in cli.findings)
