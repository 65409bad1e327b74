"""What differs between the torch releases the remote set-up accepts, on the real modules of the
torch this runs under (tools/torch_versions.sh runs it under the floor, ENGINE_MIN_TORCH, and the
newest release; README's test command under the pinned one): TF32 through the API this torch has,
resolve_precision on a (mocked) GPU without a stand-in module, and the packed-attention kernel this
torch offers."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from packaging.version import Version

from lorapod.compute.bootstrap import ENGINE_MIN_TORCH
from lorapod.engine import attention
from lorapod.engine.device import new_tf32_api, resolve_precision, set_tf32, tf32_flags

from .test_engine_cuda_choices import fake_gpu

running = Version(torch.__version__.split("+")[0])


def test_this_is_the_torch_the_stage_asked_for():
    want = os.environ.get("LORAPOD_EXPECT_TORCH")
    if not want:
        pytest.skip("LORAPOD_EXPECT_TORCH not set (README's test command runs the pinned torch)")
    assert running == Version(want), f"running torch {torch.__version__}, the stage wanted {want}"
    assert running >= Version(ENGINE_MIN_TORCH)


def test_tf32_round_trips_on_this_torchs_own_modules():
    before = tf32_flags()
    try:
        set_tf32(True)
        assert tf32_flags() == (True, True)
        set_tf32(False)
        assert tf32_flags() == (False, False)
    finally:
        set_tf32(*before)
    # torch 2.9 brought fp32_precision; 2.7 and 2.8 have only allow_tf32 (review N1)
    assert new_tf32_api() == (running >= Version("2.9"))


def test_a_cuda_job_resolves_its_precision_on_this_torch(monkeypatch):
    before = tf32_flags()
    fake_gpu(monkeypatch, 9, 0)
    try:
        p = resolve_precision("auto", "auto", torch.device("cuda"))
        assert p.compute == "bf16" and tf32_flags() == (True, True)
    finally:
        set_tf32(*before)


def test_the_packed_kernel_this_torch_offers():
    has_varlen = importlib.util.find_spec("torch.nn.attention.varlen") is not None
    assert attention.varlen_available() is has_varlen
    assert not has_varlen or running >= Version("2.9")
    desc = attention.AttentionPath("sdpa", False, "t").describe(torch.device("cuda"))
    assert ("on torch's varlen_attn" in desc) is has_varlen
