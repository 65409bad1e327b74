"""Units: what a step is, in the plan and in every published source the speed model is fitted to.

Every trainer's ``max_steps`` and save / sample intervals count optimizer steps; a step time is
measured per micro-batch. A published figure read in the wrong one is 4x off with accumulation 4
(the diffusers FLUX QLoRA blog's 700 steps x 4 in 41 minutes were once read as 700 micro-batches).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.errors import PlanError
from lorapod.plan.choose import plan_job
from lorapod.plan.measurements import Source, Unit, _per_micro_batch, load_measurements
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FLUX_QLORA_BLOG = ["model.family=flux1", "model.id=black-forest-labs/FLUX.1-dev", "method.type=qlora",
                   "method.r=4", "data.resolution=627", "train.grad_accum=4", "train.max_steps=700"]


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.delenv("VAST_API_KEY", raising=False)


def test_max_steps_with_accumulation_counts_optimizer_steps_and_their_micro_batches():
    spec = load_spec(EXAMPLES / "flux2-klein-lora.yaml", FLUX_QLORA_BLOG)
    job = plan_job(spec, images=2800, gpu="RTX 4090").job
    assert (job.optimizer_steps, job.steps) == (700, 2800)
    assert job.steps_label == "700 steps (2800 micro-batches)"
    # samples and saves every 250 optimizer steps of the 700, 2 prompts: not every 250 micro-batches of
    # the uncapped 2800 images x 10 repeats x 9 epochs
    assert job.checkpoints == 2
    assert job.samples == 2 * 2


def test_without_accumulation_a_step_is_a_micro_batch():
    job = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25).job
    assert job.optimizer_steps == job.steps == 2000
    assert job.steps_label == "2000 steps"


def test_accumulation_per_epoch_rounds_up_as_the_trainers_do():
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml", ["train.grad_accum=3"])
    job = plan_job(spec, images=25).job
    assert job.steps == 2000  # 250 micro-batches an epoch, 8 epochs
    assert job.optimizer_steps == 84 * 8  # ceil(250 / 3) an epoch (engine/loop.py: steps_per_epoch)


def _obs(source: str, **settings):
    out = [o for o in load_measurements()[1] if o.source.id == source and o.metric == "seconds_per_step"]
    return [o for o in out if all(getattr(o.settings, k) == v for k, v in settings.items())]


def test_the_flux_qlora_blog_is_read_per_micro_batch():
    (o,) = _obs("hf-flux-qlora", base_dtype="nf4")
    assert o.settings.grad_accum == 4
    assert o.value == pytest.approx(41 * 60 / 700 / 4, rel=1e-3)  # 0.88 s, not 3.51
    assert o.printed == "3.514 s per optimizer step of 4"  # what --explain shows next to it


def test_printed_it_per_s_and_optimizer_steps_become_seconds_per_micro_batch():
    qwen = _obs("qwen-readme", seq_len=256)[0]  # "20.1G / 1.2s/it" at batch 1, accumulation 8
    assert qwen.value == pytest.approx(1.2 / 8)
    kohya = _obs("kohya-ss-1288", batch=1, optimizer="adafactor")[0]  # "1.08 it/s"
    assert kohya.value == pytest.approx(1 / 1.08)


def test_every_speed_source_says_what_its_step_counts_with_the_sentence_it_was_read_from():
    for o in load_measurements()[1]:
        if o.is_speed:
            assert o.source.unit is not None, o.source.id
            assert o.source.unit.quote.strip(), o.source.id


def _source(counts: str) -> Source:
    return Source("s", "u", "t", "r", "hf", "device", Unit(counts, "s/it", "gpu", "step only", "3 s/it"))


def test_a_step_time_that_contradicts_its_sources_unit_is_refused():
    # a source that counts optimizer steps, accumulation 4, entered as seconds per micro-batch
    with pytest.raises(PlanError, match="seconds_per_optimizer_step"):
        _per_micro_batch(0, _source("optimizer"), "seconds_per_step", 3.51, 4)
    with pytest.raises(PlanError, match="micro-batches"):
        _per_micro_batch(0, _source("micro-batch"), "seconds_per_optimizer_step", 3.51, 4)
    assert _per_micro_batch(0, _source("optimizer"), "seconds_per_optimizer_step", 3.6, 4) == ("seconds_per_step", 0.9)
    assert _per_micro_batch(0, _source("optimizer"), "seconds_per_step", 3.6, 1) == ("seconds_per_step", 3.6)
