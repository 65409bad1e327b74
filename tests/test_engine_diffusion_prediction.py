"""Epsilon vs v-prediction for SD checkpoints that are single files, and the noise offset of flow models.

Detection reads real .safetensors headers written here. Loading a single file goes through
diffusers' ``from_single_file``, which needs the original (LDM) tensor layout and a config from
the hub; neither is available offline, so the engine test reproduces what it does for every
non-SD2 file (an *epsilon* scheduler, whatever the model was trained on) by loading the tiny
epsilon diffusers folder in its place. Everything after loading is the real engine.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lorapod.builtin.sd import build_sd15
from lorapod.engine.diffusion import families, train_diffusion
from lorapod.errors import SpecError
from lorapod.prediction_type import detect_single_file, expected
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import image_spec, write_images

torch.set_num_threads(1)


def single_file(path, *, v_key=False, metadata=None, unet=None):
    """An SD 1.5-shaped single file: LDM U-Net key names (what family detection reads), optional marker."""
    tensors = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4, 4, 3, 3)}
    if unet is not None:
        tensors |= {f"model.diffusion_model.{k}": v.contiguous() for k, v in unet.items()}
    if v_key:
        tensors["v_pred"] = torch.tensor([])  # NoobAI-XL V-Pred's marker (ComfyUI reads it too)
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_single_file_markers(tmp_path):
    assert detect_single_file(single_file(tmp_path / "a.safetensors", v_key=True)) == ("v_prediction", "its 'v_pred' key")
    assert detect_single_file(single_file(tmp_path / "b.safetensors", metadata={"ss_v_parameterization": "True"}))[0] \
        == "v_prediction"
    assert detect_single_file(single_file(tmp_path / "c.safetensors", metadata={"ss_v_parameterization": "False"}))[0] \
        == "epsilon"
    assert detect_single_file(single_file(tmp_path / "d.safetensors", metadata={"modelspec.prediction_type": "v"}))[0] \
        == "v_prediction"
    found, why = detect_single_file(single_file(tmp_path / "noobaiXLNAIXL_vPred10Version.safetensors"))
    assert found == "v_prediction" and "NoobAI" in why
    assert detect_single_file(single_file(tmp_path / "mymerge-vpred.safetensors"))[0] == "v_prediction"
    assert detect_single_file(single_file(tmp_path / "prediction.safetensors")) == (None, "")  # 'vpred' not a word here
    assert expected(str(tmp_path / "prediction.safetensors"), "sd15")[0] == "epsilon"
    assert expected(str(tmp_path / "prediction.safetensors"), "sd15", "v_prediction") == ("v_prediction",
                                                                                        "model.prediction_type")
    assert expected(str(tmp_path / "prediction.safetensors"), "flux1") == (None, "")


def test_plan_warns_loudly_about_the_epsilon_default(tmp_path):
    from lorapod.plan.job import build_job

    plain = single_file(tmp_path / "anime.safetensors")
    marked = single_file(tmp_path / "anime-marked.safetensors", v_key=True)

    def warnings(model, **extra):
        spec = load_spec(raw={"model": {"id": str(model), "family": "sd15", **extra},
                              "data": {"path": str(tmp_path / "imgs"), "format": "images"}})
        return [w for w in build_job(spec, images=10).warnings if "EPSILON" in w]

    assert len(warnings(plain)) == 1 and "model.prediction_type: v_prediction" in warnings(plain)[0]
    assert warnings(marked) == []
    assert warnings(plain, prediction_type="epsilon") == []


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vpred")
    folder = build_sd15(root / "sd15")
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(folder / "unet").state_dict()
    return {"folder": folder, "data": write_images(root / "data", n=2), "root": root,
            "marked": single_file(root / "tiny-anime.safetensors", v_key=True, unet=unet),
            "plain": single_file(root / "tiny-plain.safetensors", unet=unet)}


def _train_single_file(assets, tmp_path, monkeypatch, model, **model_extra):
    original = families.Family.load

    def load_like_from_single_file(self, model_id, revision, dtype):
        # diffusers' from_single_file gives a non-SD2 file an epsilon scheduler: so does the folder
        comps = original(self, str(assets["folder"]), revision, dtype)
        assert comps.scheduler.config.prediction_type == "epsilon"
        comps.model_id = model_id
        return comps

    monkeypatch.setattr(families.Family, "load", load_like_from_single_file)
    raw = image_spec(model, assets["data"], tmp_path / "runs", "sd15", epochs=1, max_steps=1)
    raw["model"].update(model_extra)
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    lines: list[str] = []
    out = train_diffusion(spec, run, device="cpu", show_progress=False, log=lines.append,
                          cache_root=tmp_path / "cache")
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        exported = fh.metadata()["ss_v_parameterization"]
    return out, lines, exported, run


def _loss_against(recipe, target_kind):
    """The recipe's loss for item 0 at t=500, and the same computed here against an explicit target."""
    from lorapod.engine.diffusion.recipe import Batch

    t = torch.tensor([500])
    batch = Batch((0,), (False,), (recipe.items[0].caption,), 0)
    with torch.no_grad():
        got = recipe.per_sample_loss(batch, 7, fixed_t=t)
        x0 = recipe.latents[(0, False)][None].float()
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(7))
        sched = recipe.noise_sched
        pred = recipe.family.forward(recipe.c, sched.add_noise(x0, noise, t), t, recipe._cond(batch), recipe._meta(batch))
        target = sched.get_velocity(x0, noise, t) if target_kind == "v" else noise
        want = torch.nn.functional.mse_loss(pred.float(), target.float())
    return float(got), float(want)


def test_marked_v_pred_single_file_trains_on_the_v_target(assets, tmp_path, monkeypatch):
    out, lines, exported, run = _train_single_file(assets, tmp_path, monkeypatch, assets["marked"])
    assert out.recipe.prediction == "v_prediction"
    assert out.recipe.noise_sched.config.prediction_type == "v_prediction"
    assert out.recipe.c.scheduler.config.prediction_type == "v_prediction"  # samples use it too
    got, want = _loss_against(out.recipe, "v")
    assert got == pytest.approx(want, rel=1e-5)
    assert got != pytest.approx(_loss_against(out.recipe, "eps")[1], rel=1e-3)
    assert "prediction type: v_prediction (its 'v_pred' key)" in lines
    assert exported == "True"
    assert "prediction type: v_prediction" in run.events_file.read_text()


def test_unmarked_single_file_trains_epsilon_and_says_so(assets, tmp_path, monkeypatch):
    out, lines, exported, run = _train_single_file(assets, tmp_path, monkeypatch, assets["plain"])
    assert out.recipe.prediction == "epsilon"
    got, want = _loss_against(out.recipe, "eps")
    assert got == pytest.approx(want, rel=1e-5)
    warning = [m for m in lines if m.startswith("[warning]") and "EPSILON" in m]
    assert len(warning) == 1 and "--v-pred" in warning[0]
    assert exported == "False"
    assert "epsilon by default" in run.events_file.read_text()


def test_prediction_type_setting_overrides_and_is_refused_for_flow_models(assets, tmp_path, monkeypatch):
    out, lines, exported, _ = _train_single_file(assets, tmp_path, monkeypatch, assets["plain"],
                                                 prediction_type="v_prediction")
    assert out.recipe.prediction == "v_prediction" and exported == "True"
    assert "prediction type: v_prediction (model.prediction_type)" in lines
    with pytest.raises(SpecError, match="flow matching"):
        from lorapod.prediction_type import resolve

        resolve("x", families.Flux2Klein(), "v_prediction", "epsilon")


def test_v_pred_cli_flag_sets_the_spec(tmp_path):
    from typer.testing import CliRunner

    from lorapod.cli.main import build_app

    spec = tmp_path / "s.yaml"
    (tmp_path / "imgs").mkdir()  # the data is here (a missing data path is refused before the run folder)
    spec.write_text(f"model: {{id: {tmp_path / 'missing.safetensors'}, family: sd15}}\n"
                    f"data: {{path: {tmp_path / 'imgs'}, format: images}}\n"
                    f"output: {{dir: {tmp_path / 'runs'}}}\n")
    # fails later (the model file is missing); a --run-dir folder is the user's and stays, spec and all
    CliRunner().invoke(build_app(), ["train", str(spec), "--v-pred", "--run-dir", str(tmp_path / "runs" / "r")])
    written = next((tmp_path / "runs").glob("*/spec.yaml")).read_text()
    assert "prediction_type: v_prediction" in written


def test_flux2_noise_offset_is_a_per_channel_shift_before_patchify():
    """FLUX.2 trains on patchified (4 x channels), batch-normalised latents. The offset must be one
    shift per VAE channel in the VAE's own latent, i.e. constant over every pixel after unpatchify."""
    from types import SimpleNamespace

    from diffusers import Flux2KleinPipeline

    bn = torch.nn.BatchNorm2d(16)
    bn.running_var = torch.linspace(0.5, 2.0, 16)
    c = SimpleNamespace(vae=SimpleNamespace(bn=bn, config=SimpleNamespace(batch_norm_eps=1e-4)))
    shape = torch.Size((2, 16, 3, 5))  # 4 VAE channels, patchified
    off = families.Flux2Klein().offset_noise(c, shape, torch.Generator().manual_seed(0))
    assert off.shape == (2, 16, 1, 1)
    raw = off.expand(shape) * torch.sqrt(bn.running_var + 1e-4).view(1, 16, 1, 1)  # undo the batch norm scale
    unpatched = Flux2KleinPipeline._unpatchify_latents(raw)  # (2, 4, 6, 10)
    assert unpatched.shape == (2, 4, 6, 10)
    flat = unpatched.flatten(2)
    assert torch.allclose(flat, flat[..., :1].expand_as(flat), atol=1e-6)  # one value per channel and sample
    assert flat[..., 0].std() > 0.1  # and they differ between channels
    default = families.Family.offset_noise(families.Flux1(), c, torch.Size((2, 16, 8, 8)), torch.Generator())
    assert default.shape == (2, 16, 1, 1)
