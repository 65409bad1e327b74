"""HunyuanVideo 1.5, the second video family, through the generic video path on a tiny random
pipeline of the real diffusers classes: training lowers the loss, a clip is sampled, a stopped run
resumes to the uninterrupted losses, the diffusers file reloads into the transformer to the trained
output, the ComfyUI file has ComfyUI's HunyuanVideo names, and the loss is the one
``HunyuanVideo15Pipeline`` samples with (its own conditioning of the transformer)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from lorapod.demo_video import write_clips
from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.diffusion.families.hunyuanvideo15 import tiny
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import Crash, train_cpu

pytest.importorskip("av")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("hv15")
    return {"model": tiny.build(root / "hv15"),
            "data": write_clips(root / "data", n=2, frames=8, sizes=[(48, 48)], images=1)}


def _spec(assets, tmp_path, sub="runs", **train):
    t = {"epochs": 2, "micro_batch_size": 1, "learning_rate": 1e-2, "seed": 0, "scheduler": "constant",
         "precision": "fp32", "timestep_sampling": "shift", "timestep_shift": 2.0}
    t.update(train)
    raw = {"model": {"id": str(assets["model"]), "family": "hunyuanvideo15"},
           "method": {"r": 4, "alpha": 8, "dropout": 0.0},
           "data": {"path": str(assets["data"]), "format": "video", "resolution": 64, "trigger": "zxq",
                    "target_frames": [1, 5], "fps": 16},
           "train": t, "eval": {"max_batches": 1}, "save": {"every_epochs": 1, "keep_last": 10},
           "output": {"dir": str(tmp_path / sub), "name": "t"}}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def test_trains_samples_and_writes_files_that_reload(assets, tmp_path):
    from diffusers import HunyuanVideo15Transformer3DModel

    spec, run = _spec(assets, tmp_path, epochs=4)
    spec.samples.prompts = ["zxq, a red square --w 32 --h 32 --f 5 --d 3 --s 2 --l 2"]
    spec.samples.every_epochs = 4
    out = train_cpu(spec, run, tmp_path)
    assert out.result.last_eval["fixed_noise_loss"] < 0.95 * out.result.first_eval["fixed_noise_loss"]
    assert (run.samples / "epoch004-00.mp4").is_file()

    recipe, fam = out.recipe, out.recipe.family
    b = recipe.epoch_batches(0)[0]
    x = torch.stack([recipe.latents[(i, False)] for i in b.items])
    noisy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.6] * len(b.items))
    cond = recipe._cond(b)
    recipe.c.denoiser.eval()
    with torch.no_grad():
        want = fam.forward(recipe.c, noisy, t, cond, {})
        tr = HunyuanVideo15Transformer3DModel.from_pretrained(str(assets["model"]), subfolder="transformer")
        base = fam.forward(recipe.c, noisy, t, cond, {}, model=tr)
        tr.load_lora_adapter(str(run.adapter), weight_name="pytorch_lora_weights.safetensors", prefix="transformer")
        got = fam.forward(recipe.c, noisy, t, cond, {}, model=tr)
    delta = (want - base).abs().mean()
    assert delta > 1e-5 and (got - want).abs().mean() < 0.01 * delta

    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:  # ComfyUI's HunyuanVideo (FLUX) names
        keys = list(fh.keys())
        meta = fh.metadata()
    modules = {k.split(".")[0] for k in keys}
    assert "lora_unet_double_blocks_0_img_attn_qkv" in modules and "lora_unet_double_blocks_1_txt_mlp_2" in modules
    assert all(m.startswith("lora_unet_double_blocks_") for m in modules)
    assert meta["ss_base_model_version"] == "hunyuan_video_1_5"
    from lorapod.export.inspect import inspect_file

    report = inspect_file(run.adapter / "t.safetensors")
    assert report["family"] == "hunyuanvideo15" and report["consumers"]["ComfyUI"]["drops"] == []


def test_the_training_input_is_the_pipelines(assets):
    """The transformer call the loss makes is the one HunyuanVideo15Pipeline's denoising loop makes (its
    own prepare_cond_latents_and_mask, zero vision states, sigma x 1000 as the timestep), caught by a
    forward hook on the pipeline's first step."""
    from diffusers import HunyuanVideo15Pipeline

    from lorapod.engine.diffusion.families import FAMILIES

    pipe = HunyuanVideo15Pipeline.from_pretrained(str(assets["model"]))
    pipe.guider.guidance_scale = 1.0  # one conditional pass
    seen = {}

    def hook(module, args, kwargs, out):
        seen.setdefault("kw", kwargs)
        seen.setdefault("out", out[0])

    h = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    pipe(prompt="zxq, a red square", num_frames=5, height=32, width=32, num_inference_steps=1, output_type="latent")
    h.remove()
    kw = seen["kw"]
    fam = FAMILIES["hunyuanvideo15"]()
    comps = fam.components(pipe, "ref")
    cond = fam.encode_text(comps, ["zxq, a red square"], torch.device("cpu"))
    z = pipe.transformer.config.out_channels
    noisy = kw["hidden_states"][:, :z]
    sigma = kw["timestep"].float() / 1000
    with torch.no_grad():
        mine = fam.forward(comps, noisy, sigma, cond, {})
    assert torch.allclose(mine, seen["out"], atol=1e-5)


def test_a_stopped_run_resumes_to_the_uninterrupted_losses(assets, tmp_path):
    spec, run = _spec(assets, tmp_path, "a", noise_offset=0.1)
    straight = train_cpu(spec, run, tmp_path).result.losses
    spec2, run2 = _spec(assets, tmp_path, "b", noise_offset=0.1)

    def crash(state, loss):
        if state.step == 7:  # after the first epoch's checkpoint
            raise Crash

    with pytest.raises(Crash):
        train_cpu(spec2, run2, tmp_path, on_step=crash)
    done = CheckpointManager(run2.checkpoints).latest().state.step
    assert 0 < done < len(straight)
    resumed = train_cpu(spec2, run2, tmp_path, resume=True).result.losses
    assert resumed == pytest.approx(straight[done:], rel=1e-5, abs=1e-6)
