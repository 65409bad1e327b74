"""The image engine end to end on tiny SD 1.5 / SDXL pipelines: loss falls, resume is exact,
caches are reused, both exported formats load and reproduce the trained model's output."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from safetensors import safe_open

from lorapod.builtin.sd import build_sd15, build_sdxl
from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.diffusion import train_diffusion
from lorapod.engine.metrics import read_metrics
from lorapod.errors import ModelLoadError
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import Crash, image_spec, write_images
from .image_fixtures import train_cpu as _train

torch.set_num_threads(1)  # tiny models: threads only contend on a shared machine


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("img")
    return {
        "sd15": build_sd15(root / "sd15"),
        "sd15v": build_sd15(root / "sd15v", prediction_type="v_prediction"),
        "sdxl": build_sdxl(root / "sdxl"),
        "data": write_images(root / "data"),
        "root": root,
    }


def _run(assets, tmp_path, family="sd15", model=None, spec_edit=None, **train):
    raw = image_spec(assets[model or family], assets["data"], tmp_path / "runs", family, **train)
    if spec_edit:
        spec_edit(raw)
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def test_sd15_learns_and_writes_run_folder_samples_and_both_formats(assets, tmp_path):
    def edit(raw):
        raw["samples"] = {"prompts": ["zxq, a red square --w 64 --h 48 --d 7 --s 2 --l 1",
                                      "zxq in the park --s 2 --n blurry"], "every_epochs": 2}

    spec, run = _run(assets, tmp_path, epochs=4, learning_rate=2e-2, spec_edit=edit)
    out = _train(spec, run, tmp_path)
    first, last = out.result.first_eval["fixed_noise_loss"], out.result.last_eval["fixed_noise_loss"]
    assert last < first * 0.97
    steps = [r for r in read_metrics(run.metrics_file) if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))  # 6 images, batch 2, 4 epochs
    # samples at epochs 2 and 4, each with its prompt and seed inside the PNG
    pngs = sorted(p.name for p in run.samples.glob("*.png"))
    assert pngs == [f"epoch{e:03d}-{k}.png" for e in (2, 4) for k in ("00", "01", "grid")]
    im = Image.open(run.samples / "epoch002-00.png")
    assert im.size == (64, 48)
    assert im.text["prompt"] == "zxq, a red square" and im.text["seed"] == "7"
    meta = json.loads(im.text["lorapod"])
    assert meta["steps"] == 2 and meta["epoch"] == 2
    assert Image.open(run.samples / "epoch002-01.png").text["negative_prompt"] == "blurry"
    # final files and one export per checkpoint (every epoch)
    assert (run.adapter / "pytorch_lora_weights.safetensors").is_file()
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        keys, md = list(fh.keys()), fh.metadata()
    assert all(k.startswith("lora_unet_") for k in keys)
    assert md["ss_network_dim"] == "4" and md["ss_network_alpha"] == "8.0" and md["ss_base_model_version"] == "sd_v1"
    assert json.loads(md["ss_tag_frequency"])["data"]["zxq"] == 6
    assert sorted(p.name for p in (run.root / "exports").iterdir()) == ["step-12", "step-3", "step-6", "step-9"]


def test_resume_reproduces_uninterrupted_losses(assets, tmp_path):
    """Crash after step 4 (checkpoint at 3), resume: steps 4.. equal the straight run, noise included."""
    spec, run = _run(assets, tmp_path / "a", family="sdxl", epochs=3)
    straight = _train(spec, run, tmp_path).result.losses
    spec2, run2 = _run(assets, tmp_path / "b", family="sdxl", epochs=3)

    def crash(state, loss):
        if state.step == 4:
            raise Crash

    with pytest.raises(Crash):
        _train(spec2, run2, tmp_path, on_step=crash)
    assert CheckpointManager(run2.checkpoints).latest().state.step == 3
    resumed = _train(spec2, run2, tmp_path, resume=True)
    assert len(straight) == 9
    assert resumed.result.losses == pytest.approx(straight[3:], rel=1e-5, abs=1e-6)
    assert [r["step"] for r in read_metrics(run2.metrics_file) if "loss" in r] == list(range(1, 10))


def test_second_run_reuses_caches_and_never_runs_the_vae_encoder(assets, tmp_path, monkeypatch):
    spec, run = _run(assets, tmp_path / "a", max_steps=1)
    first = _train(spec, run, tmp_path)
    assert first.cache_hits == 0 and first.cache_misses == 6 + 6  # 6 latents, 6 captions
    from diffusers import AutoencoderKL

    def boom(*a, **k):
        raise AssertionError("the VAE encoder ran although every latent was cached")

    monkeypatch.setattr(AutoencoderKL, "encode", boom)
    spec2, run2 = _run(assets, tmp_path / "b", max_steps=1)
    second = _train(spec2, run2, tmp_path)
    assert second.cache_hits == 12 and second.cache_misses == 0
    assert second.result.losses == pytest.approx(first.result.losses, rel=1e-6)


def test_caption_shuffle_is_disabled_with_a_warning_when_text_outputs_are_cached(assets, tmp_path):
    def edit(raw):
        raw["data"]["shuffle_captions"] = True

    spec, run = _run(assets, tmp_path, max_steps=1, spec_edit=edit)
    logs: list[str] = []
    train_diffusion(spec, run, device="cpu", show_progress=False, log=logs.append, cache_root=tmp_path / "c")
    assert any("shuffle/dropout is off" in m for m in logs)


def test_wrong_family_is_refused_before_caching(assets, tmp_path):
    spec, run = _run(assets, tmp_path, family="sdxl", model="sd15")
    with pytest.raises(ModelLoadError, match="StableDiffusionPipeline"):
        _train(spec, run, tmp_path)
    assert not (tmp_path / "cache").exists()


def _unet_inputs(recipe):
    b = recipe.epoch_batches(0)[0]
    x0 = torch.stack([recipe.latents[(i, f)] for i, f in zip(b.items, b.flips, strict=True)])
    g = torch.Generator().manual_seed(3)
    noisy = torch.randn(x0.shape, generator=g)
    t = torch.tensor([400] * len(b.items))
    cond = recipe.family.encode_text(recipe.c, list(b.captions), torch.device("cpu"))
    return noisy, t, cond, recipe._meta(b)


def _perturb(recipe, scale=0.2):
    """Random LoRA B weights so the adapter's effect is large and any alpha mistake shows."""
    g = torch.Generator().manual_seed(1)
    sd = {k: (torch.randn(v.shape, generator=g) * scale if ".lora_B." in k else v) for k, v in recipe.adapter_state().items()}
    recipe.load_adapter_state(sd)


@pytest.mark.parametrize("family,rslora", [("sd15", False), ("sdxl", True)])
def test_exported_files_reproduce_the_trained_output(assets, tmp_path, family, rslora):
    """diffusers' own loaders, given our files, give the model we trained (kohya: at strength 1.0)."""
    import diffusers

    def edit(raw):
        raw["method"].update({"rslora": rslora, "train_text_encoder": True, "alpha": 3})

    spec, run = _run(assets, tmp_path, family=family, max_steps=2, spec_edit=edit)
    out = _train(spec, run, tmp_path)
    recipe = out.recipe
    _perturb(recipe)
    recipe.save_final(run.adapter)
    fam = recipe.family
    with torch.no_grad():
        noisy, t, _, meta = _unet_inputs(recipe)
        for m in recipe.lora_modules.values():
            m.eval()
        caps = list(recipe.epoch_batches(0)[0].captions)
        want = fam.forward(recipe.c, noisy, t, fam.encode_text(recipe.c, caps, torch.device("cpu")), meta)
        cls = getattr(diffusers, fam.pipeline_class)
        results = {}
        for weight in ("pytorch_lora_weights.safetensors", "t.safetensors"):
            pipe = cls.from_pretrained(str(assets[family]))
            base = fam.forward(fam.components(pipe, "x"), noisy, t, fam.encode_text(fam.components(pipe, "x"), caps, torch.device("cpu")), meta)
            pipe.load_lora_weights(str(run.adapter), weight_name=weight)
            c = fam.components(pipe, "x")
            results[weight] = fam.forward(c, noisy, t, fam.encode_text(c, caps, torch.device("cpu")), meta)
    delta = (want - base).abs().mean()
    assert delta > 1e-2  # the adapter really changes the output
    for weight, got in results.items():
        assert (got - want).abs().mean() < 0.01 * delta, weight
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        keys = list(fh.keys())
        alpha = fh.get_tensor(next(k for k in keys if k.endswith(".alpha")))
    # the exact names ComfyUI / A1111 / Forge map (transformers 5's CLIPTextModel has no text_model.
    # level; the file must still say text_model, or those loaders drop the text-encoder half)
    te_prefixes = {"sd15": ("lora_te",), "sdxl": ("lora_te1", "lora_te2")}[family]
    layers = ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj")
    assert {k.split(".")[0] for k in keys if k.startswith("lora_te")} == {
        f"{p}_text_model_encoder_layers_{b}_{x}" for p in te_prefixes for b in range(2) for x in layers}
    # rank 4, alpha 3: plain LoRA stores 3; rsLoRA trained at 3/sqrt(4) = 1.5 -> stores 1.5 * 4 = 6
    assert float(alpha) == pytest.approx(6.0 if rslora else 3.0)


def test_v_prediction_with_min_snr_trains(assets, tmp_path):
    spec, run = _run(assets, tmp_path, model="sd15v", epochs=2, min_snr_gamma=5.0, noise_offset=0.05,
                     gradient_checkpointing=True)
    out = _train(spec, run, tmp_path)
    assert out.recipe.prediction == "v_prediction"
    assert out.recipe.c.denoiser.is_gradient_checkpointing
    assert all(torch.isfinite(torch.tensor(out.result.losses)))
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        assert fh.metadata()["ss_v_parameterization"] == "True"


def test_fp8_base_weights_need_cuda_and_keep_lora_trainable(assets, tmp_path):
    from diffusers import UNet2DConditionModel

    from lorapod.engine.diffusion import attach_lora, lora_config, store_fp8
    from lorapod.errors import HardwareError

    def edit(raw):
        raw["model"]["dtype"] = "fp8"

    spec, run = _run(assets, tmp_path, spec_edit=edit)
    with pytest.raises(HardwareError, match="fp8"):  # CPU here; Ada/Hopper GPUs only
        _train(spec, run, tmp_path)
    # the storage scheme itself (CPU here): float8 base weights, fp32 LoRA, gradients flow
    unet = UNet2DConditionModel.from_pretrained(str(assets["sd15"] / "unet"))
    unet.requires_grad_(False)
    assert store_fp8(unet) > 10
    attach_lora(unet, lora_config(spec, ["to_q", "to_v"]))
    assert unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q.base_layer.weight.dtype == torch.float8_e4m3fn
    assert unet.down_blocks[1].attentions[0].transformer_blocks[0].ff.net[2].weight.dtype == torch.float8_e4m3fn
    assert unet.dtype == torch.float32  # what pipelines read to allocate latents
    lora = [p for p in unet.parameters() if p.requires_grad]
    assert lora and all(p.dtype == torch.float32 for p in lora)
    out = unet(torch.randn(1, 4, 16, 16), torch.tensor([10]), encoder_hidden_states=torch.randn(1, 16, 32)).sample
    out.square().mean().backward()
    assert all(p.grad is not None for p in lora)


def test_live_text_encoders_allow_caption_shuffle_and_uncached_latents_stay_off_disk(assets, tmp_path):
    def edit(raw):
        raw["data"].update({"shuffle_captions": True, "caption_dropout": 0.5, "cache_text_encoder_outputs": False,
                            "cache_latents": False})

    spec, run = _run(assets, tmp_path, epochs=1, spec_edit=edit)
    logs: list[str] = []
    out = train_diffusion(spec, run, device="cpu", show_progress=False, log=logs.append, cache_root=tmp_path / "c")
    assert not any("shuffle/dropout is off" in m for m in logs)
    caps = [c for b in out.recipe.epoch_batches(0) for c in b.captions]
    assert "" in caps  # caption dropout applies with live text encoders
    assert out.recipe.epoch_batches(0) == out.recipe._make_batches(0)  # deterministic per epoch
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.safetensors"))


def test_lorapod_train_cli_trains_an_image_spec(assets, tmp_path, capsys):
    import yaml

    from lorapod.cli.main import main

    raw = image_spec(assets["sd15"], assets["data"], tmp_path / "runs", "sd15", max_steps=1)
    raw["data"]["cache_latents"] = False
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(raw), encoding="utf-8")
    main(["train", str(f)])
    err = capsys.readouterr().err
    assert "adapter:" in err and "fixed-noise loss: base" in err
    adapters = list((tmp_path / "runs").glob("t-*/adapter/t.safetensors"))
    assert len(adapters) == 1


def test_vae_and_text_encoder_compute_in_their_own_dtype_under_the_training_autocast(assets, tmp_path, monkeypatch):
    """G13: autocast casts every conv and linear to its dtype whatever the weights are, so the fp32
    VAE of the fp16 path (sd-scripts' --no_half_vae) computed in fp16 anyway, in latent caching and
    every sample decode (black samples), and so did T5's fp32 layers. CPU autocast in bf16 stands in
    for CUDA's fp16: latents are cached as the fp32 VAE makes them, and the VAE and text encoder
    give fp32 inside the engine's autocast, where the pipelines call them."""
    import lorapod.engine.diffusion as engine
    from lorapod.engine.device import Precision
    from lorapod.engine.diffusion import dataset

    precision = Precision(torch.device("cpu"), "bf16", torch.float32)
    monkeypatch.setattr(engine, "resolve_precision", lambda *a: precision)
    spec, run = _run(assets, tmp_path)
    recipe, _, _ = engine.prepare(spec, run, device="cpu", log=lambda m: None, cache_root=tmp_path / "cache")
    c = recipe.c
    px = dataset.load_pixels(recipe.items[0], False).unsqueeze(0)
    with torch.no_grad():
        want = c.vae.encode(px).latent_dist.mean * c.vae.config.scaling_factor
        assert torch.allclose(recipe.latents[(0, False)], want[0], atol=1e-5)
        with precision.autocast():
            img = c.vae.decode(want.to(torch.bfloat16)).sample
            ids = c.tokenizers[0](["zxq"], return_tensors="pt").input_ids
            states = c.text_encoders[0](ids)[0]
    assert img.dtype == torch.float32 and states.dtype == torch.float32
