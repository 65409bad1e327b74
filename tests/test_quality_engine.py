"""The quality autopilot inside lorapod's engine, on CPU with tiny random models built in code: an SD 1.5
pipeline (builtin/sd.py) and the scorers lorapod:tiny-clip / lorapod:tiny-dinov2 (builtin/scorers.py),
the tiny Llama for LLM runs. Their numbers mean nothing; what is tested is where they come from and
what the run does with them: the held-out image never trains, every checkpoint is scored against the
base where it is made, train.stop_when ends the run normally at a checkpoint, a crash and a resume
keep the scores and do not score a checkpoint twice, and the pick outlives save.keep_last."""

from __future__ import annotations

import json

import pytest
import torch

from lorapod.builtin.sd import build_sd15
from lorapod.engine.checkpoint import CheckpointManager, TrainState
from lorapod.engine.metrics import read_metrics
from lorapod.rundir import RunDir
from lorapod.rundir import quality as files
from lorapod.spec import load_spec

from .image_fixtures import Crash, image_spec, write_images
from .image_fixtures import train_cpu as _train

torch.set_num_threads(1)

QUALITY = {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "steps": 1, "strengths": [0.5, 1.0],
           "prompts": ["zxq on a beach --w 48 --h 48", "a bowl of fruit --w 48 --h 48"]}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    return {"sd15": build_sd15(root / "sd15"), "data": write_images(root / "data", n=9), "root": root}


def make(assets, tmp_path, quality=None, **train):
    raw = image_spec(assets["sd15"], assets["data"], tmp_path / "runs", "sd15", **train)
    raw["quality"] = {**QUALITY, **(quality or {})}
    raw["save"] = {"every_steps": 2, "every_epochs": None, "keep_last": 1}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def test_checkpoints_are_scored_where_they_are_made_and_stop_when_ends_the_run(assets, tmp_path):
    spec, run = make(assets, tmp_path, max_steps=8, stop_when={"target": -1.0})
    out = _train(spec, run, tmp_path)
    # 9 subject images: one held out by content hash, never trained on (8 latents, 4 steps per epoch)
    held = files.read_json(run.root, files.HOLDOUT)
    assert held["count"] == 1 and "1 of 9 subject images" in held["why"]
    assert {it.path.name for it in out.recipe.items}.isdisjoint({p.split("/")[-1] for p in held["held"]})
    assert len(out.recipe.items) == 8
    # the target is reached at the first checkpoint: the run ends there, normally, with its adapter
    assert out.result.stopped == "stop_when" and out.result.state.step == 2
    assert (run.adapter / "pytorch_lora_weights.safetensors").is_file()
    stop = files.read_json(run.root, files.STOPPED)
    assert stop["step"] == 2 and stop["steps_saved"] == 6 and stop["seconds_saved"] > 0
    (rec,) = files.read_scores(run.root)
    assert rec["models"] == {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2",
                             "phash": "imagehash.phash (64-bit DCT hash)"}
    assert set(rec["strengths"]) == {"0.5", "1"} and rec["references"] == 1
    entry = rec["strengths"]["1"]
    assert set(entry["fidelity_by"]) == {"dino", "clip_i"} and entry["prompts"] == {"fidelity": 1, "leakage": 1}
    assert isinstance(entry["score"], float) and entry["memorised"] is False
    pick = files.read_json(run.root, files.PICK)
    assert pick["checkpoint"] == "step-2" and pick["strength"] in (0.5, 1.0)
    # the score is in metrics.jsonl for the dashboard, and the run's log says what happened
    q = [r for r in read_metrics(run.metrics_file) if r.get("event") == "quality"]
    assert len(q) == 1 and q[0]["step"] == 2 and q[0]["quality_score"] == pytest.approx(decide_best(rec))
    events = run.events_file.read_text()
    assert "quality autopilot on" in events and "train.stop_when: stopping at step 2" in events
    # the images scored: the base once, the checkpoint at each strength, as thumbnails
    renders = sorted(p.relative_to(run.root / "quality").as_posix() for p in (run.root / "quality" / "renders").rglob("*.jpg"))
    assert renders == ["renders/base/p00.jpg", "renders/base/p01.jpg", "renders/step-2/p00-s0.5.jpg",
                       "renders/step-2/p00-s1.jpg", "renders/step-2/p01-s0.5.jpg", "renders/step-2/p01-s1.jpg"]


def decide_best(rec):
    from lorapod.quality.decide import best_of

    return best_of(rec).score


def test_a_crash_and_a_resume_keep_the_scores_and_the_pick_outlives_keep_last(assets, tmp_path):
    spec, run = make(assets, tmp_path, max_steps=6, quality={"strengths": [1.0]})

    def crash(state, loss):
        if state.step == 5:
            raise Crash

    with pytest.raises(Crash):
        _train(spec, run, tmp_path, on_step=crash)
    assert [r["step"] for r in files.read_scores(run.root)] == [2, 4]
    base = (run.root / "quality" / files.BASE).read_bytes()
    out = _train(spec, run, tmp_path, resume=True)
    scores = files.read_scores(run.root)
    assert [r["step"] for r in scores] == [2, 4, 6]  # step 4, resumed from, not scored again
    lines = (run.root / "quality" / files.SCORES).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [2, 4, 6]
    assert (run.root / "quality" / files.BASE).read_bytes() == base  # the base row drawn once per run
    assert out.result.state.step == 6
    # save.keep_last: 1 keeps the newest checkpoint, and the pick beside it whichever it is
    pick = files.read_json(run.root, files.PICK)["checkpoint"]
    on_disk = {p.name for p in run.checkpoints.iterdir()}
    assert on_disk == {"step-6", pick}


def test_keep_last_never_deletes_a_protected_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1, protect=lambda: {"step-1"})
    for step in (1, 2, 3):
        mgr.save(TrainState(step=step), {"w": torch.zeros(1)}, {"optimizer": {}, "scheduler": {}})
    assert [p.name for p in mgr.list()] == ["step-1", "step-3"]
    plain = CheckpointManager(tmp_path / "plain", keep_last=1)
    for step in (1, 2):
        plain.save(TrainState(step=step), {"w": torch.zeros(1)}, {"optimizer": {}, "scheduler": {}})
    assert [p.name for p in plain.list()] == ["step-2"]


def test_without_a_scorer_nothing_is_held_out_and_the_run_says_the_autopilot_is_off(assets, tmp_path):
    spec, run = make(assets, tmp_path, max_steps=2, quality={"clip": "no/such-model", "dino": None})
    out = _train(spec, run, tmp_path)
    assert len(out.recipe.items) == 9  # nothing to score against: every image trains
    pick = files.read_json(run.root, files.PICK)
    assert pick["autopilot"] == "off" and pick["checkpoint"] is None
    assert "no scorer model loaded" in pick["reason"] and "no/such-model" in pick["reason"]
    assert files.read_scores(run.root) == []  # never a made-up number
    assert "quality autopilot off" in run.events_file.read_text()


def test_quality_off_scores_nothing(assets, tmp_path):
    spec, run = make(assets, tmp_path, max_steps=2, quality={"score": "off"})
    out = _train(spec, run, tmp_path)
    assert len(out.recipe.items) == 9 and not (run.root / "quality").exists()


def test_llm_checkpoints_are_scored_by_held_out_loss_and_answers(tmp_path):
    from lorapod.engine.llm import train_llm

    from .llm_fixtures import make_assets, spec_dict

    _, model_dir, train, val = make_assets(tmp_path)
    raw = spec_dict(model_dir, train, val, tmp_path / "runs", max_steps=6)
    raw["save"] = {"every_steps": 3, "every_epochs": None, "keep_last": 5}
    raw["quality"] = {"examples": 4, "max_new_tokens": 8}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    out = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    scores = files.read_scores(run.root)
    assert [r["step"] for r in scores] == [3, 6]
    entry = scores[-1]["strengths"]["1"]
    assert entry["examples"] == 4 and 0.0 <= entry["f1"] <= 1.0 and entry["val_loss"] < entry["val_loss_base"]
    # the base row is the model with the adapter disabled: its held-out loss is the one measured before
    # the first step (when the fresh LoRA's zero B leaves the model as the base)
    base = files.read_json(run.root, files.BASE)
    assert base["val_loss"] == pytest.approx(out.result.first_eval["val_loss"], rel=1e-5)
    assert len(base["f1"]) == 4 and scores[-1]["samples"][0]["reference"]
    pick = files.read_json(run.root, files.PICK)
    assert pick["autopilot"] == "on" and pick["checkpoint"] in ("step-3", "step-6") and pick["strength"] == 1.0


def test_image_eval_scores_the_checkpoints_the_run_did_not_and_recommends_the_pick(assets, tmp_path):
    from lorapod.evaluate.images import evaluate_images

    spec, run = make(assets, tmp_path, max_steps=4, quality={"strengths": [1.0]})
    spec.save.keep_last = 5
    run.write_spec(spec)
    _train(spec, run, tmp_path)
    scores = run.root / "quality" / files.SCORES
    scores.write_text(scores.read_text().splitlines()[0] + "\n")  # step-4 was not scored while training
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("zxq on a table --w 48 --h 48\n")
    res = evaluate_images(run.root, prompts, (1.0,), steps=1, device="cpu", log=lambda m: None)
    assert [r["step"] for r in files.read_scores(run.root)] == [2, 4]
    decision = files.read_json(run.root, files.PICK)
    assert res.best == decision["checkpoint"] and res.strength == 1.0 and res.reason.startswith("quality autopilot:")
    assert res.quality["table"][1]["checkpoint"] == "step-4"
    page = (run.root / "eval" / "images.html").read_text()
    assert f"recommended: {res.best} at strength 1" in page and "score (vs base)" in page
