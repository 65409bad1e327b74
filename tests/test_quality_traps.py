"""The quality autopilot's known traps, each with the guard that handles it (peers review 2026-12-05, Q1):

- scores against the training images reward copying: the references are held out, and a checkpoint whose
  image is a perceptual-hash copy of a training image is never picked (AnimaLoraStudio #319);
- the base row must really be the base: strength 0 disables the LoRA, whose layers then never run
  (AnimaLoraStudio #324: ``x or 1.0`` turned a scale of 0 into 1 and every difference into 0);
- no-reference aesthetic scores (BRISQUE) rate over-smoothed images better (Fizgig #47): they are not
  part of the decision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lorapod.quality import decide, measure
from lorapod.quality.autopilot import Autopilot, ImageScoring
from lorapod.quality.prompts import ScorePrompt
from lorapod.quality.scorers import Scorers, load_embedder
from lorapod.rundir import quality as files
from lorapod.spec import validate

from .image_fixtures import image_spec, write_images


@pytest.fixture(scope="module")
def scorers() -> Scorers:
    return Scorers(clip=load_embedder("lorapod:tiny-clip", "clip"), dino=load_embedder("lorapod:tiny-dinov2", "dino"),
                   hashes=True)


def noisy(img: Image.Image, amount: float, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    a = np.asarray(img.convert("RGB"), dtype=np.float32)
    return Image.fromarray(np.clip(a * (1 - amount) + rng.uniform(0, 255, a.shape) * amount, 0, 255).astype(np.uint8))


PROMPTS = [ScorePrompt("zxq on a beach", 11, False, "on a beach"), ScorePrompt("zxq in a forest", 12, False, "in a forest"),
           ScorePrompt("a bowl of fruit", 13, True, "a bowl of fruit")]


def scripted_run(tmp_path: Path, scorers: Scorers, copy_at: int) -> dict:
    """Three checkpoints scored by the real autopilot; the images are scripted: the base draws grey,
    checkpoints draw a training image half drowned in noise, and checkpoint ``copy_at`` draws the
    training image itself, untouched (a LoRA that memorised it)."""
    data = write_images(tmp_path / "data", n=6)
    imgs = [Image.open(p).convert("RGB").resize((64, 64)) for p in sorted(data.glob("*.png"))]
    training, refs = imgs[:5], imgs[5:]
    state = {"step": 0}

    def render(sp: ScorePrompt, strength: float) -> list[Image.Image]:
        if strength == 0.0 or sp.leakage:
            return [Image.new("RGB", (64, 64), (128, 128, 128))]
        src = training[sp.seed % 5]
        return [src.copy() if state["step"] == copy_at else noisy(src, 0.5, state["step"] * 100 + sp.seed)]

    spec = validate({"model": {"id": "x"}, "data": {"path": str(data)}})
    pilot = Autopilot(spec, tmp_path / "run", ImageScoring(tmp_path / "run", scorers, PROMPTS, [1.0], refs, training,
                                                          render), log=lambda m: None)
    for step in (10, 20, 30):
        state["step"] = step
        pilot.on_checkpoint(step, 100)
    return files.read_json(tmp_path / "run", files.PICK)


def test_a_checkpoint_that_copies_a_training_image_is_never_picked(tmp_path, scorers, monkeypatch):
    scorers = Scorers(dino=scorers.dino, hashes=True)  # likeness alone: the copy is the likest
    pick = scripted_run(tmp_path / "a", scorers, copy_at=20)
    assert pick["checkpoint"] != "step-20" and pick["checkpoint"] is not None
    copied = next(t for t in pick["table"] if t["checkpoint"] == "step-20")
    assert copied["memorised"] == ["1"] and "copies of training images" in pick["reason"]
    rec = next(r for r in files.read_scores(tmp_path / "a" / "run") if r["step"] == 20)
    assert rec["strengths"]["1"]["phash_min"] == 0  # the exact copy: no bit apart
    # the trap is real: without the memorisation guard the copy scores best and is picked
    monkeypatch.setattr(measure, "COPY_BITS", -1)
    unguarded = scripted_run(tmp_path / "b", scorers, copy_at=20)
    assert unguarded["checkpoint"] == "step-20"


def test_the_base_row_is_drawn_at_strength_zero_exactly(tmp_path, scorers):
    seen: list[float] = []

    def render(sp, strength):
        seen.append(strength)
        return [Image.new("RGB", (32, 32), (int(strength * 100), 0, 0))]

    scoring = ImageScoring(tmp_path, scorers, PROMPTS, [0.6, 1.0], [], [], render)
    scoring.measure(10)
    assert seen[:3] == [0.0, 0.0, 0.0] and sorted(set(seen[3:])) == [0.6, 1.0]
    assert files.read_json(tmp_path, files.BASE)["strength"] == 0.0


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The image engine's recipe on a tiny SD 1.5, ready to draw, its LoRA weights made large."""
    from lorapod.builtin.sd import build_sd15
    from lorapod.engine.diffusion import prepare
    from lorapod.rundir import RunDir

    tmp = tmp_path_factory.mktemp("recipe")
    model = build_sd15(tmp / "sd15")
    data = write_images(tmp / "data", n=4)
    raw = image_spec(model, data, tmp / "runs", "sd15")
    raw["quality"] = {"prompts": ["zxq on a beach --w 32 --h 32"], "steps": 1}
    spec = validate(raw)
    run = RunDir.create(tmp / "runs", "t")
    run.write_spec(spec)
    r, _, _ = prepare(spec, run, "cpu", lambda m: None, tmp / "cache")
    with torch.no_grad():  # gaussian-initialised A and zero B: give B weight, so the LoRA changes images
        for m in r.lora_modules.values():
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    return r


def test_strength_zero_never_runs_the_loras_layers(recipe):
    from peft.tuners.lora import LoraLayer

    layers = [m for mod in recipe.lora_modules.values() for m in mod.modules() if isinstance(m, LoraLayer)]
    calls = [0]
    hooks = [layer.lora_A["default"].register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
             for layer in layers]
    try:
        sp = recipe.score_prompts[0]
        base = np.asarray(recipe.render(sp, 0.0)[0])
        assert calls[0] == 0  # disabled: not one LoRA forward (a scale of 0 would still run them)
        full = np.asarray(recipe.render(sp, 1.0)[0])
        assert calls[0] > 0 and not np.array_equal(base, full)
        # the LoRA really was off: changing its weights does not move the base image by one bit
        with torch.no_grad():
            for layer in layers:
                layer.lora_B["default"].weight.mul_(3.0)
        assert np.array_equal(np.asarray(recipe.render(sp, 0.0)[0]), base)
    finally:
        for h in hooks:
            h.remove()
    # and the layers are as training left them: enabled, their scaling and trainable weights untouched
    assert all(not layer.disable_adapters for layer in layers)
    assert all(p.requires_grad for p in recipe.trainable_parameters())


def test_strength_scales_every_lora_layer_and_restores_it(recipe):
    from peft.tuners.lora import LoraLayer

    from lorapod.engine.diffusion.lora import lora_strength

    layers = [m for mod in recipe.lora_modules.values() for m in mod.modules() if isinstance(m, LoraLayer)]
    before = [dict(layer.scaling) for layer in layers]
    with lora_strength(recipe.lora_modules.values(), 0.6) as n:
        assert n == len(layers) > 0
        assert all(layer.scaling["default"] == pytest.approx(0.6 * b["default"]) for layer, b in zip(layers, before, strict=True))
    assert [dict(layer.scaling) for layer in layers] == before


def test_aesthetic_scores_are_not_part_of_the_decision():
    """A record may carry any other number (a host wrote it, or a future scorer): the pick reads
    ``score`` alone, so an over-smoothed checkpoint that a no-reference score (BRISQUE: lower is
    "better") prefers is not picked for it."""
    faithful = {"step": 10, "checkpoint": "step-10",
                "strengths": {"1": {"score": 0.30, "se": 0.01, "brisque": 41.0, "aesthetic": 4.1}}}
    smoothed = {"step": 20, "checkpoint": "step-20",
                "strengths": {"1": {"score": 0.10, "se": 0.01, "brisque": 12.0, "aesthetic": 7.9}}}
    assert decide.pick([faithful, smoothed])["checkpoint"] == "step-10"
    assert decide.stop_reason([faithful, smoothed], plateau=1, target=None, min_checkpoints=1) is not None
    import inspect

    assert set(inspect.signature(decide.image_score).parameters) == {"fidelity", "adherence", "leakage"}

