"""External trainers at a preemption (issue 36, item 5): every job lorapod builds saves the
trainer's own resumable state and resumes from the newest one, with the flags the trainer's
recorded parser accepts (trainers/contracts). How much each can lose is docs/trainers.md's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapod.spec import load_spec
from lorapod.trainers import get, prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.contracts import check_job

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _spec(name: str, sets: list[str]):
    return load_spec(EXAMPLES / name, ["save.every_steps=100", *sets])


@pytest.mark.parametrize(("trainer", "example", "sets"), [
    ("sd-scripts", "sdxl-object-lora.yaml", []),
    # step-counted: an epoch-counted musubi job resumes from the run's total in its metrics (its own test:
    # test_trainers_recorded_real.py test_musubi_resume_trains_the_steps_left_and_counts_on)
    ("musubi-tuner", "wan21-video-lora.yaml", ["train.max_steps=400"]),
])
def test_kohya_jobs_save_state_and_resume_from_it_with_flags_their_parsers_accept(tmp_path, trainer, example, sets):
    t, job = prepare(_spec(example, sets), trainer, Layout(str(tmp_path / "work")), images=25)
    argv = job.commands[-1].argv
    assert "--save_state" in argv and argv[argv.index("--save_every_n_steps") + 1] == "100"
    ckpt = tmp_path / "pulled" / "step-200"
    (ckpt / "state").mkdir(parents=True)
    (ckpt / "state" / "train_state.json").write_text(json.dumps({"current_epoch": 1, "current_step": 200}))
    t.resume(job, ckpt)
    argv = job.commands[-1].argv
    assert argv[argv.index("--resume") + 1] == str(ckpt / "state")
    check_job(t, job)  # the recorded parser of the pinned version takes every flag, --resume included


def test_axolotl_resumes_from_the_trainer_checkpoint_and_can_save_on_demand(tmp_path):
    example = "llm-chat-lora.yaml"
    t, job = prepare(_spec(example, []), "axolotl", Layout(str(tmp_path / "work")))
    assert job.config["save_steps"] == 100 and job.config["dynamic_checkpoint"]["enabled"]
    assert t.stop_trigger(Layout(str(tmp_path / "work"))) is not None  # what SIGTERM touches
    ckpt = tmp_path / "pulled" / "step-200"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    t.resume(job, ckpt)
    assert job.config["resume_from_checkpoint"] == str(ckpt)
    check_job(t, job)


def test_ai_toolkit_resumes_from_its_newest_save(tmp_path):
    spec = load_spec(EXAMPLES / "flux2-klein-lora.yaml", ["save.every_steps=100"])
    t, job = prepare(spec, "ai-toolkit", Layout(str(tmp_path / "work")), images=25)
    assert job.config["config"]["process"][0]["save"]["save_every"] == 100
    ckpt = tmp_path / "pulled" / "step-201"
    ckpt.mkdir(parents=True)
    (ckpt / "style_000000200.safetensors").write_bytes(b"x")
    t.resume(job, ckpt)
    assert [v for v in job.files.values() if v.startswith("@link:")] == [f"@link:{ckpt / 'style_000000200.safetensors'}"]
    check_job(t, job)


def test_only_axolotl_has_a_save_on_demand():
    layout = Layout("/w")
    assert [n for n in ("sd-scripts", "musubi-tuner", "ai-toolkit", "axolotl")
            if get(n).stop_trigger(layout) is not None] == ["axolotl"]
