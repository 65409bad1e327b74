"""The planner on the guide's Wan2.1 job (W3) and on clips vs stills.

The guide's "2-8 h" for about 1,800 steps on an L40S or an RTX 4090 was never used to fit the
speed model (docs/planner.md lists what was), so it is a fair held-out check."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.plan.choose import plan_job
from lorapod.plan.job import build_job
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("gpu", ["L40S", "RTX 4090"])
def test_the_guides_wan_job_lands_in_the_guides_range(gpu):
    spec = load_spec(EXAMPLES / "wan21-video-lora.yaml")
    plan = plan_job(spec, gpu=gpu, images=18)  # the example's comment: 18 images x 100 epochs
    best = plan.options[0]
    assert plan.job.steps == 1800
    assert best.gpu == gpu and best.verdict != "does-not-fit"
    assert 2.0 <= best.hours_total <= 8.0, best.hours_total


def test_clips_plan_at_their_window_lengths_and_stills_at_one_frame(tmp_path):
    spec = load_spec(EXAMPLES / "wan21-video-lora.yaml")
    stills = build_job(spec, images=18)
    assert stills.settings.frames == 1  # data.format: images
    clips = spec.model_copy(deep=True)
    clips.data.format = "video"
    clips.data.target_frames = [1, 17, 33]
    as_clips = build_job(clips, images=18)
    assert as_clips.settings.frames == (1, 17, 33)
    assert as_clips.estimate.peak_gb > stills.estimate.peak_gb
    # format auto: the folder decides
    auto = spec.model_copy(deep=True)
    auto.data.format = "auto"
    folder = tmp_path / "stills"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"")
    auto.data.path = str(folder)
    assert build_job(auto, images=18).settings.frames == 1
    (folder / "b.mp4").write_bytes(b"")
    assert build_job(auto, images=18).settings.frames == tuple(auto.data.target_frames)


# --------------------------------------------------------------- Wan2.1 I2V and Wan2.2 catalog entries
# The transformer configs of diffusers' scripts/convert_wan_to_diffusers.py (get_transformer_config);
# the catalog's sizes must equal what these build to, not a figure copied into both places.
_WAN_BASE = {"attention_head_dim": 128, "cross_attn_norm": True, "eps": 1e-06, "freq_dim": 256, "out_channels": 16,
             "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "text_dim": 4096}
_WAN_14B = {"ffn_dim": 13824, "num_attention_heads": 40, "num_layers": 40}
WAN_CONFIGS = {
    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers": ("wan21-i2v-14b", {**_WAN_14B, "in_channels": 36, "image_dim": 1280,
                                                                "added_kv_proj_dim": 5120}),
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": ("wan22-t2v-a14b", {**_WAN_14B, "in_channels": 16}),
    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": ("wan22-i2v-a14b", {**_WAN_14B, "in_channels": 36}),
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": ("wan22-ti2v-5b", {"ffn_dim": 14336, "num_attention_heads": 24,
                                                          "num_layers": 30, "in_channels": 48, "out_channels": 48}),
}


@pytest.mark.parametrize("model_id", list(WAN_CONFIGS))
def test_wan_entries_resolve_and_match_a_meta_build_of_the_real_config(model_id):
    import re

    import torch
    from diffusers import WanTransformer3DModel

    from lorapod.catalog.models import find_model
    from lorapod.engine.diffusion.families.wan import WAN_TARGETS

    key, cfg = WAN_CONFIGS[model_id]
    m = find_model(model_id)
    assert m.key == key and m.is_video
    with torch.device("meta"):
        tr = WanTransformer3DModel(**{**_WAN_BASE, **cfg})
    assert m.trained_params_b == pytest.approx(sum(p.numel() for p in tr.parameters()) / 1e9, rel=5e-4)
    assert m.blocks == m.attn_blocks == len(tr.blocks)
    assert m.hidden == tr.config.num_attention_heads * tr.config.attention_head_dim
    # LoRA per rank: in + out features of every Linear the engine targets
    lora = sum(mod.in_features + mod.out_features for name, mod in tr.named_modules()
               if isinstance(mod, torch.nn.Linear) and re.match(WAN_TARGETS, name))
    assert m.lora_params_per_rank_m == pytest.approx(lora / 1e6, rel=5e-4)
    assert m.experts == (2 if "A14B" in model_id else 1)
    assert find_model(model_id.removesuffix("-Diffusers")) == m


def test_wan_image_encoder_and_wan22_vae_match_meta_builds():
    import torch
    from diffusers import AutoencoderKLWan
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    from lorapod.catalog.models import find_model

    with torch.device("meta"):
        # laion/CLIP-ViT-H-14-laion2B-s32B-b79K, the image encoder diffusers' converter saves for Wan2.1 I2V
        clip = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120, patch_size=14,
            image_size=224, projection_dim=1024))
        # the converter's vae22_diffusers_config (without its latents_mean/std)
        vae22 = AutoencoderKLWan(base_dim=160, z_dim=48, is_residual=True, in_channels=12, out_channels=12,
                                 decoder_base_dim=256, scale_factor_temporal=4, scale_factor_spatial=16, patch_size=2)
    i2v = find_model("Wan-AI/Wan2.1-I2V-14B-720P")
    assert i2v.image_encoder_params_b == pytest.approx(sum(p.numel() for p in clip.parameters()) / 1e9, rel=1e-3)
    assert find_model("wan22-ti2v-5b").vae_params_b == pytest.approx(
        sum(p.numel() for p in vae22.parameters()) / 1e9, rel=1e-3)
    assert find_model("wan22-ti2v-5b").patch_px == vae22.config.scale_factor_spatial * 2


def _wan22_spec(**train):
    spec = load_spec(EXAMPLES / "wan21-video-lora.yaml")
    spec.model.id, spec.model.family, spec.model.variant = "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan22", None
    for k, v in train.items():
        setattr(spec.train, k, v)
    return spec


def test_wan22_plans_with_both_experts_resident_or_one():
    from lorapod.catalog.models import find_model
    from lorapod.plan.vram import BYTES_PER_PARAM, GiB, make_fit

    both = build_job(_wan22_spec(), images=18)
    one = build_job(_wan22_spec(experts="high_noise"), images=18)
    m = find_model("Wan-AI/Wan2.2-T2V-A14B-Diffusers")
    assert both.model == m and both.settings.experts == "both" and one.settings.experts == "high_noise"
    assert one.estimate.peak_gb < both.estimate.peak_gb
    # what the engine keeps on the GPU: one more 14B expert (fp8 here) and its LoRA when both train
    expert_gb = m.trained_params_b * 1e9 * BYTES_PER_PARAM["fp8"] / GiB
    assert both.estimate.parts["base weights (dit, fp8, 2 experts)"] == pytest.approx(2 * expert_gb, abs=1e-3)
    assert one.estimate.parts["base weights (dit, fp8)"] == pytest.approx(expert_gb, abs=1e-3)
    assert both.estimate.parts["activations"] == one.estimate.parts["activations"]  # one expert runs per step
    # on a 24 GB card the cheapest change that fits is one expert per run
    fix = make_fit(m, both.settings, 24.0)
    assert fix is not None and fix.sets == ("train.experts=low_noise",)
    plan = plan_job(_wan22_spec(), images=18)
    assert plan.options and plan.options[0].verdict != "does-not-fit"


def test_wan22_family_from_a_local_diffusers_index(tmp_path):
    import json

    from lorapod.catalog.models import find_model

    index = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    assert find_model(str(tmp_path)).family == "wan22"
    (tmp_path / "model_index.json").write_text(json.dumps({**index, "transformer_2": [None, None],
                                                           "boundary_ratio": None}))
    assert find_model(str(tmp_path)).family == "wan21"
