"""FLUX.1 and FLUX.2 klein on tiny transformers: flow-matching training, timestep sampling, and
files that reload to the trained model."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from lorapod.builtin.sd import build_flux1, build_flux2_klein
from lorapod.engine.diffusion import train_diffusion
from lorapod.engine.diffusion.recipe import sample_sigmas
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import image_spec, write_images

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux")
    return {"flux1": build_flux1(root / "flux1"), "flux2": build_flux2_klein(root / "flux2"),
            "data": write_images(root / "data")}


def _train(assets, tmp_path, family, spec_edit=None, **train):
    raw = image_spec(assets[family], assets["data"], tmp_path / "runs", family, **train)
    if spec_edit:
        spec_edit(raw)
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return train_diffusion(spec, run, device="cpu", show_progress=False, log=lambda m: None,
                           cache_root=tmp_path / "cache"), run


@pytest.mark.parametrize("family,sampling", [("flux1", "shift"), ("flux2", "logit_normal")])
def test_flux_learns_samples_and_reloads(assets, tmp_path, family, sampling):
    import diffusers

    def edit(raw):
        raw["samples"] = {"prompts": ["zxq, a red square --w 64 --h 64 --s 2 --d 3"], "every_steps": 6}
        raw["method"]["rslora"] = True

    out, run = _train(assets, tmp_path, family, spec_edit=edit, epochs=4, learning_rate=3e-2,
                      timestep_sampling=sampling)
    first, last = out.result.first_eval["fixed_noise_loss"], out.result.last_eval["fixed_noise_loss"]
    assert last < first * 0.99
    assert sorted(p.name for p in run.samples.glob("*.png")) == [
        f"step{s:06d}-{k}.png" for s in (6, 12) for k in ("00", "grid")]

    recipe = out.recipe
    fam = recipe.family
    b = recipe.epoch_batches(0)[0]
    x = torch.stack([recipe.latents[(i, False)] for i in b.items])
    noisy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.6] * len(b.items))
    cond = recipe._cond(b)
    recipe.c.denoiser.eval()
    with torch.no_grad():
        want = fam.forward(recipe.c, noisy, t, cond, {})
        pipe = getattr(diffusers, fam.pipeline_class).from_pretrained(str(assets[family]))
        base = fam.forward(fam.components(pipe, "x"), noisy, t, cond, {})
        pipe.load_lora_weights(str(run.adapter), weight_name="pytorch_lora_weights.safetensors")
        got = fam.forward(fam.components(pipe, "x"), noisy, t, cond, {})
    delta = (want - base).abs().mean()
    assert delta > 1e-4
    assert (got - want).abs().mean() < 0.01 * delta

    # kohya-style file: sd-scripts' names on the original (BFL) modules, q/k/v fused (rank 3 x 4)
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        keys = list(fh.keys())
        modules = {k.split(".")[0] for k in keys}
        assert "lora_unet_double_blocks_0_img_attn_qkv" in modules and "lora_unet_single_blocks_0_linear1" in modules
        assert all(m.startswith(("lora_unet_double_blocks_0_", "lora_unet_single_blocks_0_")) for m in modules)
        alpha = float(fh.get_tensor("lora_unet_double_blocks_0_img_attn_proj.alpha"))
        qkv_alpha = float(fh.get_tensor("lora_unet_double_blocks_0_img_attn_qkv.alpha"))
        assert fh.metadata()["ss_base_model_version"] == {"flux1": "flux1", "flux2": "flux2_klein"}[family]
    assert qkv_alpha == pytest.approx(8 / 2 * 12)
    assert alpha == pytest.approx(8 / 2 * 4)  # rsLoRA: alpha / sqrt(r) * r


def test_flux_timestep_sampling_modes():
    g = torch.Generator().manual_seed(0)
    u = sample_sigmas(20000, "uniform", 3.0, g)
    ln = sample_sigmas(20000, "logit_normal", 3.0, g)
    sh = sample_sigmas(20000, "shift", 3.0, g)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert float(u.mean()) == pytest.approx(0.5, abs=0.02)
    assert float(ln.mean()) == pytest.approx(0.5, abs=0.02) and float(ln.std()) < float(u.std())
    assert float(sh.mean()) > 0.65  # shifted toward high noise, as for high-resolution Flux training


def test_text_encoder_lora_is_refused_for_flux(assets, tmp_path):
    from lorapod.errors import SpecError

    def edit(raw):
        raw["method"]["train_text_encoder"] = True

    with pytest.raises(SpecError, match="train_text_encoder"):
        _train(assets, tmp_path, "flux2", spec_edit=edit, max_steps=1)


def test_flux2_resume_reproduces_uninterrupted_losses(assets, tmp_path):
    from lorapod.engine.checkpoint import CheckpointManager

    class Crash(Exception):
        pass

    def make(sub):
        raw = image_spec(assets["flux2"], assets["data"], tmp_path / sub, "flux2", epochs=2,
                         timestep_sampling="logit_normal", noise_offset=0.1)  # offset drawn before patchify
        spec = load_spec(raw=raw)
        run = RunDir.create(spec.output.dir, "t")
        run.write_spec(spec)
        return spec, run

    kw = {"device": "cpu", "show_progress": False, "log": lambda m: None, "cache_root": tmp_path / "cache"}
    spec, run = make("a")
    straight = train_diffusion(spec, run, **kw).result.losses
    spec2, run2 = make("b")

    def crash(state, loss):
        if state.step == 5:
            raise Crash

    with pytest.raises(Crash):
        train_diffusion(spec2, run2, on_step=crash, **kw)
    assert CheckpointManager(run2.checkpoints).latest().state.step == 3
    resumed = train_diffusion(spec2, run2, resume=True, **kw).result.losses
    assert len(straight) == 6 and resumed == pytest.approx(straight[3:], rel=1e-5, abs=1e-6)


def test_fp8_base_path_trains_and_samples(assets, tmp_path, monkeypatch):
    """What model.dtype fp8 does on an Ada/Hopper GPU, on CPU: load in bf16, store the block linears
    in float8, train the fp32 LoRA under bf16 autocast, sample through the pipeline."""
    import lorapod.engine.diffusion as engine
    from lorapod.engine.device import Precision

    monkeypatch.setattr(engine, "resolve_precision",
                        lambda *a: Precision(torch.device("cpu"), "bf16", torch.float8_e4m3fn))

    def edit(raw):
        raw["samples"] = {"prompts": ["zxq, a red square --w 64 --h 64 --s 2"], "every_steps": 2}

    out, run = _train(assets, tmp_path, "flux2", spec_edit=edit, max_steps=2, precision="bf16")
    tr = out.recipe.c.denoiser
    assert tr.transformer_blocks[0].attn.to_q.base_layer.weight.dtype == torch.float8_e4m3fn
    assert tr.dtype == torch.bfloat16  # what the pipeline allocates latents in
    assert all(torch.isfinite(torch.tensor(out.result.losses)))
    assert (run.samples / "step000002-00.png").is_file()


@pytest.mark.parametrize("family", ["flux1", "flux2"])
def test_denoiser_and_text_encoders_are_never_on_the_accelerator_together(assets, tmp_path, monkeypatch, family):
    """G2: ``prepare`` moved the transformer, the VAE and every text encoder to the GPU before caching
    (FLUX.1: 22 GiB + 9 GiB of CLIP and T5 on a card the plan sized for the transformer alone). A
    recorder on ``nn.Module.to`` follows where each one is sent: the engine's device (a
    ``torch.device``, here the CPU standing in for the GPU) or back to ``"cpu"``; the denoiser must
    arrive only after the encoders have left, and the latents and texts must be cached by then."""
    from lorapod.engine.diffusion import prepare

    moves: list[tuple[int, str]] = []
    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        where = kwargs.get("device", args[0] if args else None)
        if isinstance(where, torch.device):
            moves.append((id(self), "device"))
        elif where == "cpu":
            moves.append((id(self), "host"))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    raw = image_spec(assets[family], assets["data"], tmp_path / "runs", family)
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    recipe, _, _ = prepare(spec, run, device="cpu", log=lambda m: None, cache_root=tmp_path / "cache")
    monkeypatch.setattr(torch.nn.Module, "to", real_to)
    den, encoders = id(recipe.c.denoiser), {id(te) for te in recipe.c.text_encoders}
    on: set[int] = set()
    for who, where in moves:
        (on.add if where == "device" else on.discard)(who)
        assert not (den in on and on & encoders), "denoiser and a text encoder on the accelerator together"
    assert den in on and (den, "device") in moves
    assert recipe.text is not None and len(recipe.latents) == 6


def test_flux_refuses_fp16_before_loading(assets, tmp_path, monkeypatch):
    """G13: FLUX overflows in fp16 (as Wan does); a T4/V100 run is refused with the reason instead
    of training on NaN."""
    import lorapod.engine.diffusion as engine
    from lorapod.engine.device import Precision
    from lorapod.errors import SpecError

    monkeypatch.setattr(engine, "resolve_precision", lambda *a: Precision(torch.device("cpu"), "fp16", torch.float16))
    loaded = []
    monkeypatch.setattr(type(engine.resolve_family("flux1", str(assets["flux1"]), None)), "load",
                        lambda *a: loaded.append(a))
    spec = load_spec(raw=image_spec(assets["flux1"], assets["data"], tmp_path / "runs", "flux1"))
    with pytest.raises(SpecError, match="fp16") as exc:
        engine.prepare(spec, RunDir.create(spec.output.dir, "t"), device="cpu", log=lambda m: None,
                       cache_root=tmp_path / "cache")
    assert "bf16" in exc.value.hint and not loaded
