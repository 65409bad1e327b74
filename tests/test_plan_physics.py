"""The speed model obeys physics whatever its fitted values: properties, never a figure it was fitted to.

- a step with gradient accumulation 4 costs about 4 micro-batches (the optimizer's read and write
  of the adapters is the only part that does not repeat);
- doubling the resolution grows a DiT's attention with the square of its tokens and its matmuls
  and memory-bound operators linearly, a U-Net's attention with the square of its pixels;
- a GPU at least as fast in every respect (tensor peak and memory bandwidth, same architecture and
  class, so the same fitted terms) is never slower.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lorapod.catalog.gpus import find_gpu, load_gpus
from lorapod.catalog.models import find_model
from lorapod.plan.choose import plan_job
from lorapod.plan.estimate import step_speed
from lorapod.plan.fit import fitted
from lorapod.plan.job import build_job
from lorapod.plan.speed import predict
from lorapod.plan.vram import Settings
from lorapod.plan.work import image_traffic_gb, step_work
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPECS = ["sdxl-object-lora.yaml", "flux2-klein-lora.yaml", "wan21-video-lora.yaml", "llm-chat-lora.yaml"]


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.delenv("VAST_API_KEY", raising=False)


def _train_hours(spec_name: str, *overrides: str) -> float:
    # enough data that max_steps, not the data, ends both runs
    plan = plan_job(load_spec(EXAMPLES / spec_name, list(overrides)), images=500, examples=50000, gpu="RTX 4090")
    option = plan.best or plan.options[0]
    return next(p.hours for p in option.phases if p.name == "train")


@pytest.mark.parametrize("spec_name", ["sdxl-object-lora.yaml", "llm-chat-lora.yaml"])
def test_an_optimizer_step_of_four_micro_batches_costs_about_four_micro_batches(spec_name):
    one = _train_hours(spec_name, "train.max_steps=100", "train.grad_accum=1")
    four = _train_hours(spec_name, "train.max_steps=100", "train.grad_accum=4")
    assert four == pytest.approx(4 * one, rel=0.03)
    assert four <= 4 * one  # the optimizer's update runs once per optimizer step


def test_doubling_a_dits_resolution_grows_attention_with_the_square_of_its_tokens():
    flux = find_model("flux1-dev")
    s = Settings("bf16", 16, "attention", "adamw", True, 1, resolution=512)
    small, big = step_work(flux, s), step_work(flux, replace(s, resolution=1024))
    img_small, img_big, text = (512 / 16) ** 2, (1024 / 16) ** 2, flux.text_tokens  # joint attention
    assert big.attention_tflops / small.attention_tflops == pytest.approx(((img_big + text) / (img_small + text)) ** 2)
    assert big.matmul_tflops / small.matmul_tflops == pytest.approx((img_big + text) / (img_small + text))
    ops = [image_traffic_gb(flux, v, 2) for v in (s, replace(s, resolution=1024))]  # counted, per token
    assert ops[1] / ops[0] == pytest.approx((img_big + text) / (img_small + text))


def test_doubling_a_unets_resolution_grows_attention_with_the_square_of_its_pixels():
    sdxl = find_model("sdxl")
    s = Settings("bf16", 16, "attention", "adamw", True, 1, resolution=512)
    small, big = step_work(sdxl, s), step_work(sdxl, replace(s, resolution=1024))
    assert big.attention_tflops == pytest.approx(16 * small.attention_tflops)
    assert big.matmul_tflops == pytest.approx(4 * small.matmul_tflops)
    assert image_traffic_gb(sdxl, replace(s, resolution=1024), 2) == pytest.approx(4 * image_traffic_gb(sdxl, s, 2))
    # and the time grows, but less than the attention: matmuls, operators and the host do not square
    gpu, p = find_gpu("RTX 4090"), fitted()
    t_small, t_big = predict(sdxl, s, gpu, p)[0], predict(sdxl, replace(s, resolution=1024), gpu, p)[0]
    assert 1 < t_big / t_small < 16


def _dominates(a, b) -> bool:
    return (a.name != b.name and a.arch == b.arch and a.gpu_class == b.gpu_class
            and a.bf16_tflops >= b.bf16_tflops and a.mem_bw_gbs >= b.mem_bw_gbs)


@pytest.mark.parametrize("spec_name", SPECS)
def test_a_gpu_faster_in_every_respect_is_never_slower(spec_name):
    job = build_job(load_spec(EXAMPLES / spec_name), images=25, examples=1000)
    gpus = load_gpus()[1]
    pairs = [(a, b) for a in gpus for b in gpus if _dominates(a, b)]
    assert pairs  # e.g. the A100 80GB over the A100 40GB, the H100 SXM over the H100 PCIe
    for a, b in pairs:
        fast = step_speed(job.model, job.settings, a, learn=False).seconds_per_step
        slow = step_speed(job.model, job.settings, b, learn=False).seconds_per_step
        assert fast <= slow * (1 + 1e-9), (a.name, b.name)


def test_a_faster_card_of_another_architecture_is_not_slower_on_the_same_job():
    """Across architectures the fitted terms differ, so this is checked on the catalog's clear
    cases: an H100 SXM (Hopper, 989 TFLOPS, 3.35 TB/s) against an A100 80GB (Ampere, 312, 2.0) and
    an RTX 4090 against an RTX 3090, for every example."""
    for spec_name in SPECS:
        job = build_job(load_spec(EXAMPLES / spec_name), images=25, examples=1000)
        for fast, slow in (("H100 SXM", "A100 80GB"), ("RTX 4090", "RTX 3090"), ("H200", "H100 SXM")):
            t_fast = step_speed(job.model, job.settings, find_gpu(fast), learn=False).seconds_per_step
            t_slow = step_speed(job.model, job.settings, find_gpu(slow), learn=False).seconds_per_step
            assert t_fast <= t_slow, (spec_name, fast, slow)
