"""The quality autopilot through an external trainer (trainers/runner.py): each checkpoint the trainer
saves is scored as it is mirrored into the run folder, train.stop_when ends the trainer at that
checkpoint (the job then ends normally), and the pick outlives save.keep_last. The scoring of a
trainer's LoRA file is diffusers' own ``load_lora_weights`` on the run's base, here on a kohya file
lorapod's engine wrote for a tiny SD 1.5 (the layout sd-scripts writes)."""

from __future__ import annotations

import shutil

import torch

from lorapod.engine.autopilot import LoraFiles, external_autopilot, lora_file
from lorapod.rundir import RunDir
from lorapod.rundir import quality as files
from lorapod.spec import load_spec
from lorapod.trainers.runner import run_trainer

from .image_fixtures import image_spec, write_images
from .image_fixtures import train_cpu as _train
from .test_trainers_runner import STANDIN, flux_spec

torch.set_num_threads(1)


class ScriptedJudge:
    """Says stop at the third checkpoint; keeps the first (the pick) beyond keep_last."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.finished = False

    def keep(self) -> set[str]:
        return {self.calls[0][0]} if self.calls else set()

    def on_checkpoint(self, run_dir, key, step, total, metrics=None, final=False):
        self.calls.append((key, step, total))
        return "plateau (scripted)" if len(self.calls) == 3 else None

    def finish(self, run_dir, metrics=None) -> None:
        self.finished = True


def test_stop_when_ends_an_external_trainer_at_the_checkpoint_it_just_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_STANDIN_STEP_S", "0.02")
    steps = 5000  # 100 s of training were it not stopped
    spec = load_spec(flux_spec(tmp_path, steps=steps, every=10))
    run = tmp_path / "run"
    judge = ScriptedJudge()
    lines: list[str] = []
    state = run_trainer(spec, "ai-toolkit", run, tmp_path / "work", src=str(STANDIN), poll_s=0.1, say=lines.append,
                        judge=judge)
    assert state == "stopped", lines
    assert [k for k, _, _ in judge.calls][:3] == ["step-11", "step-21", "step-31"]
    assert all(total == steps for _, _, total in judge.calls)  # the trainer's own count, bridged
    assert any("train.stop_when" in x and "plateau (scripted)" in x for x in lines)
    # keep_last: 2 kept the newest two, and the pick beside them (the scoring runs beside the trainer's
    # loop, so a save or a few more may come before the stop is acted on: how many depends on the load)
    kept = sorted((p.name for p in (run / "checkpoints").iterdir()), key=lambda k: int(k.split("-")[1]))
    assert kept[0] == "step-11" and len(kept) == 3 and int(kept[-1].split("-")[1]) >= 31
    # the trainer was ended soon after its save at 31 (the bound leaves 20 s for the reaction on a busy
    # machine), not at its 5000th step
    assert len((run / "metrics.jsonl").read_text().splitlines()) < 1000


def test_a_trainers_kohya_file_is_scored_with_diffusers_on_the_base(tmp_path):
    from lorapod.builtin.sd import build_sd15

    model = build_sd15(tmp_path / "sd15")
    data = write_images(tmp_path / "data", n=4)
    raw = image_spec(model, data, tmp_path / "runs", "sd15", max_steps=2, learning_rate=5e-2)
    raw["save"] = {"every_steps": 2, "every_epochs": None}
    raw["quality"] = {"score": "off"}
    spec = load_spec(raw=raw)
    trained = RunDir.create(spec.output.dir, "t")
    trained.write_spec(spec)
    _train(spec, trained, tmp_path)
    kohya = next(p for p in (trained.root / "exports" / "step-2").glob("*.safetensors")
                 if p.name != "pytorch_lora_weights.safetensors")
    # a run folder as the runner mirrors an sd-scripts job into it
    ext = tmp_path / "ext"
    (ext / "checkpoints" / "step-2" / "state").mkdir(parents=True)
    shutil.copy(kohya, ext / "checkpoints" / "step-2" / "mug-step00000002.safetensors")
    refs = tmp_path / "refs"
    refs.mkdir()
    shutil.copy(sorted(data.glob("*.png"))[0], refs / "ref.png")
    raw["quality"] = {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "steps": 1, "strengths": [1.0],
                      "prompts": ["zxq on a beach --w 48 --h 48", "a bowl of fruit --w 48 --h 48"]}
    raw["data"]["holdout_path"] = str(refs)
    ext_spec = load_spec(raw=raw)
    assert lora_file(ext / "checkpoints" / "step-2").name == "mug-step00000002.safetensors"
    judge = external_autopilot(ext_spec, ext, lambda m: None)
    assert judge.keep() == set() and judge.pilot is None  # nothing loaded before the first checkpoint
    assert judge.on_checkpoint(ext, "step-2", 2, 10) is None
    (rec,) = files.read_scores(ext)
    assert rec["checkpoint"] == "step-2" and rec["references"] == 1
    assert set(rec["strengths"]["1"]["fidelity_by"]) == {"dino", "clip_i"}
    # the file really was loaded: the checkpoint draws differently from the base at the same seed
    lf: LoraFiles = judge.files
    assert lf.pipe.get_list_adapters()  # diffusers holds the adapter
    sp = judge.pilot.scoring.prompts[0]
    assert list(lf.render(sp, 0.0)[0].getdata()) != list(lf.render(sp, 1.0)[0].getdata())
    assert files.read_json(ext, files.PICK)["checkpoint"] == "step-2"


def test_an_external_llm_run_says_it_is_scored_after_training(tmp_path):
    spec = load_spec(raw={"model": {"id": "x", "family": "llm"}, "data": {"path": "d"}})
    judge = external_autopilot(spec, tmp_path, lambda m: None)
    assert judge.on_checkpoint(tmp_path, "step-3", 3, 10) is None
    assert "lorapod eval" in files.read_json(tmp_path, files.PICK)["reason"]
