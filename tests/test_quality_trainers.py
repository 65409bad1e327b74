"""The quality autopilot through an external trainer (trainers/runner.py): each checkpoint the trainer
saves is scored as it is mirrored into the run folder, train.stop_when ends the trainer at that
checkpoint (the job then ends normally), and the pick outlives save.keep_last. The scoring of a
trainer's LoRA file is diffusers' own ``load_lora_weights`` on the run's base, here on a kohya file
lorapod's engine wrote for a tiny SD 1.5 (the layout sd-scripts writes)."""

from __future__ import annotations

import json
import shutil

import pytest
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


@pytest.fixture(scope="module")
def llm_pair(tmp_path_factory):
    """A lorapod run of a tiny Llama, scored while it trained, and an axolotl run folder of the same
    weights: each checkpoint as the Hugging Face Trainer saves a PEFT model (``save_pretrained``:
    adapter_model.safetensors and adapter_config.json in checkpoint-N), mirrored as the runner
    mirrors it (checkpoints/step-N, the whole folder)."""
    from lorapod.engine.checkpoint import CheckpointManager
    from lorapod.engine.llm import prepare, train_llm

    from .llm_fixtures import make_assets, spec_dict

    tmp = tmp_path_factory.mktemp("ext-llm")
    _, model_dir, train, val = make_assets(tmp)
    raw = spec_dict(model_dir, train, val, tmp / "runs", max_steps=6)
    raw["save"] = {"every_steps": 3, "every_epochs": None, "keep_last": 5}
    raw["quality"] = {"examples": 4, "max_new_tokens": 8}
    spec = load_spec(raw=raw)
    own = RunDir.create(spec.output.dir, "own")
    own.write_spec(spec)
    train_llm(spec, own, device="cpu", show_progress=False, log=lambda m: None)
    recipe, _, _ = prepare(spec, "cpu", log=lambda m: None)
    ext = tmp / "ext"
    mgr = CheckpointManager(own.checkpoints)
    for step in (3, 6):
        recipe.load_adapter_state(mgr.load(own.checkpoints / f"step-{step}").adapter())
        folder = ext / "checkpoints" / f"step-{step}"
        recipe.model.save_pretrained(str(folder))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    RunDir(ext).write_spec(spec)
    RunDir(ext).write_trainer("axolotl")
    return spec, raw, own, ext


def test_an_external_llm_trainers_checkpoints_are_scored_as_lorapods_own(llm_pair):
    spec, _, own, ext = llm_pair
    judge = external_autopilot(spec, ext, lambda m: None)
    assert judge.on_checkpoint(ext, "step-3", 3, 6) is None
    assert judge.on_checkpoint(ext, "step-6", 6, 6) is None
    scores, mine = files.read_scores(ext), files.read_scores(own.root)
    assert [r["checkpoint"] for r in scores] == ["step-3", "step-6"]
    for theirs, ours in zip(scores, mine, strict=True):  # the same weights: the same held-out numbers
        a, b = theirs["strengths"]["1"], ours["strengths"]["1"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5) and a["f1"] == b["f1"]
        assert a["score"] == pytest.approx(b["score"], rel=1e-4, abs=1e-6)
    assert files.read_json(ext, files.PICK)["checkpoint"] == files.read_json(own.root, files.PICK)["checkpoint"]


def test_an_external_llm_adapter_that_is_not_the_runs_lora_ends_the_scoring_with_the_reason(llm_pair, tmp_path):
    spec, _, _, ext = llm_pair
    other = tmp_path / "other"
    shutil.copytree(ext / "checkpoints" / "step-3", other / "checkpoints" / "step-3")
    cfg = json.loads((other / "checkpoints" / "step-3" / "adapter_config.json").read_text())
    cfg["r"] = 4
    (other / "checkpoints" / "step-3" / "adapter_config.json").write_text(json.dumps(cfg))
    judge = external_autopilot(spec, other, lambda m: None)
    assert judge.on_checkpoint(other, "step-3", 3, 6) is None
    pick = files.read_json(other, files.PICK)
    assert pick["autopilot"] == "off" and "not this run's LoRA" in pick["reason"] and files.read_scores(other) == []


def test_a_partial_adapter_leaves_no_weight_of_the_checkpoint_before(llm_pair):
    """Modules the file does not adapt change nothing: their lora_B is zeroed, not left as the last
    checkpoint loaded had it."""
    from safetensors.torch import load_file

    from lorapod.engine.autopilot import load_peft_adapter
    from lorapod.engine.llm import prepare

    spec, _, _, ext = llm_pair
    recipe, _, _ = prepare(spec, "cpu", log=lambda m: None)
    state = load_file(str(ext / "checkpoints" / "step-6" / "adapter_model.safetensors"))
    load_peft_adapter(recipe, state, ext / "x")
    some = {k: v for k, v in state.items() if ".layers.0." in k}
    assert some and len(some) < len(state)
    load_peft_adapter(recipe, some, ext / "x")
    now = recipe.adapter_state()
    assert all(torch.equal(now[k], v) for k, v in some.items())
    assert all(not now[k].any() for k in state if k not in some and ".lora_B." in k)


def test_an_external_llm_run_without_val_path_says_why_it_is_not_scored(llm_pair, tmp_path):
    _, raw, _, _ = llm_pair
    spec = load_spec(raw={**raw, "data": {**raw["data"], "val_path": None, "val_split": 0.2}})
    judge = external_autopilot(spec, tmp_path, lambda m: None)
    assert judge.on_checkpoint(tmp_path, "step-3", 3, 10) is None
    reason = files.read_json(tmp_path, files.PICK)["reason"]
    assert "data.val_path" in reason and "its own validation split" in reason


def test_lorapod_eval_reads_an_external_llm_runs_checkpoints(llm_pair, tmp_path):
    from lorapod.evaluate.llm import evaluate_llm

    _, _, own, ext = llm_pair
    copy = tmp_path / "ext"
    shutil.copytree(ext, copy)
    res = evaluate_llm(copy, n_prompts=1, device="cpu", max_new_tokens=4, log=lambda m: None)
    ours = evaluate_llm(own.root, n_prompts=1, device="cpu", max_new_tokens=4, log=lambda m: None, score=False)
    assert [r.label for r in res.rows] == ["base", "step-3", "step-6"]
    assert [r.val_loss for r in res.rows] == pytest.approx([r.val_loss for r in ours.rows], rel=1e-5)
    assert [r["step"] for r in files.read_scores(copy)] == [3, 6]  # scored here, as the run did not
    assert res.quality["checkpoint"] == res.best


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_a_musubi_wan_lora_is_scored_on_clips_drawn_by_diffusers(tmp_path, i2v):
    """musubi-tuner's Wan LoRA (the ``lora_unet_*`` layout, written here by lorapod's own kohya
    writer from a PEFT adapter with weight in it) loaded by diffusers on the run's base (a tiny
    Wan2.1 built in code; its pipeline, text- or image-to-video, as the model's index says):
    scoring clips of the trained window length, scored by their frames against the held-out
    references; the training clips hashed by their first frame (an I2V clip starts from one)."""
    pytest.importorskip("av")
    from diffusers import WanImageToVideoPipeline, WanPipeline
    from peft import LoraConfig, get_peft_model_state_dict

    from lorapod.builtin.wan import build_wan
    from lorapod.demo_video import write_clips
    from lorapod.export.kohya import save_kohya, to_kohya

    model = build_wan(tmp_path / "wan21", "wan21", i2v=i2v)
    data = write_clips(tmp_path / "data", n=2, frames=8, sizes=[(48, 48)], images=1)
    refs = tmp_path / "refs"
    refs.mkdir()
    shutil.copy(next(data.glob("*.png")), refs / "ref.png")
    pipe = (WanImageToVideoPipeline if i2v else WanPipeline).from_pretrained(str(model))
    # networks.lora_wan's modules: attention and MLP (diffusers' musubi converter reads both)
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=[
        "to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pipe.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    ext = tmp_path / "ext"
    (ext / "checkpoints" / "step-4").mkdir(parents=True)
    save_kohya(ext / "checkpoints" / "step-4" / "t-000004.safetensors",
               to_kohya({"transformer": get_peft_model_state_dict(pipe.transformer)}, "wan21", 4.0, False), {})
    spec = load_spec(raw={
        "model": {"id": str(model), "family": "wan21"}, "method": {"r": 4, "alpha": 4},
        "data": {"path": str(data), "format": "video", "resolution": 64, "trigger": "zxq", "target_frames": [1, 5],
                 "fps": 16, "holdout_path": str(refs)},
        "quality": {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2", "steps": 1, "strengths": [1.0],
                    "prompts": ["zxq sliding --w 32 --h 32", "a green field --w 32 --h 32"]},
        "train": {"max_steps": 8}, "output": {"dir": str(tmp_path / "runs"), "name": "t"}})
    judge = external_autopilot(spec, ext, lambda m: None)
    assert judge.on_checkpoint(ext, "step-4", 4, 8) is None
    assert files.read_scores(ext), files.read_json(ext, files.PICK)["reason"]
    (rec,) = files.read_scores(ext)
    assert rec["checkpoint"] == "step-4" and rec["references"] == 1
    entry = rec["strengths"]["1"]
    assert set(entry["fidelity_by"]) == {"dino", "clip_i"} and entry["phash_min"] is not None
    assert len(judge.pilot.scoring.refs.train_hashes) == 3  # two clips' first frames and the still
    lf: LoraFiles = judge.files
    assert type(lf.pipe).__name__ == type(pipe).__name__
    sp = judge.pilot.scoring.prompts[0]
    base, tuned = lf.render(sp, 0.0), lf.render(sp, 1.0)
    assert len(base) == len(tuned) == 5 and base[0].size == (32, 32)  # the longest trained window, 5 frames
    assert any(list(a.getdata()) != list(b.getdata()) for a, b in zip(base, tuned, strict=True))
