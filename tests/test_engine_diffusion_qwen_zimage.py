"""Z-Image and Qwen-Image in lorapod's own engine, on tiny random pipelines of the real diffusers
classes: training lowers the loss, samples are drawn, the diffusers file reloads to the trained
model, the ComfyUI (kohya) file has ComfyUI's names, and a run stopped mid-way resumes to the
uninterrupted losses. The loss itself is judged against diffusers' own training scripts in
tests/test_reference_diffusers_scripts.py."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.diffusion.families.qwenimage import tiny as qwen_tiny
from lorapod.engine.diffusion.families.zimage import tiny as zimage_tiny
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import Crash, image_spec, train_cpu, write_images

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("qz")
    return {"zimage": zimage_tiny.build(root / "zimage"), "qwenimage": qwen_tiny.build(root / "qwenimage"),
            "data": write_images(root / "data")}


def _run(assets, tmp_path, family, sub="runs", edit=None, **train):
    raw = image_spec(assets[family], assets["data"], tmp_path / sub, family, **train)
    if edit:
        edit(raw)
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


@pytest.mark.parametrize("family", ["zimage", "qwenimage"])
def test_trains_samples_and_the_diffusers_file_reloads_to_the_trained_model(assets, tmp_path, family):
    import diffusers

    def edit(raw):
        raw["samples"] = {"prompts": ["zxq, a red square --w 64 --h 64 --s 2 --d 3 --l 2"], "every_steps": 6}

    spec, run = _run(assets, tmp_path, family, edit=edit, epochs=4, learning_rate=3e-2, timestep_sampling="shift",
                     timestep_shift=2.2)
    out = train_cpu(spec, run, tmp_path)
    assert out.result.last_eval["fixed_noise_loss"] < out.result.first_eval["fixed_noise_loss"] * 0.99
    assert sorted(p.name for p in run.samples.glob("*.png")) == [
        f"step{s:06d}-{k}.png" for s in (6, 12) for k in ("00", "grid")]

    recipe, fam = out.recipe, out.recipe.family
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

    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        keys = list(fh.keys())
        modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in keys}
        meta = fh.metadata()
    from lorapod.evaluate.images import evaluate_images
    from lorapod.export.targets import export_run

    done = export_run(run.root, "comfyui", checkpoint=3, out=tmp_path / "c")  # `lorapod export` re-writes the file
    from lorapod.rundir.layout import checkpoint_name

    engine_file = run.root / "exports" / checkpoint_name(3) / "t.safetensors"
    with safe_open(str(done.out / "t.safetensors"), "pt") as fh, safe_open(str(engine_file), "pt") as eng:
        assert set(fh.keys()) == set(eng.keys())
        assert all(torch.equal(fh.get_tensor(k), eng.get_tensor(k)) for k in eng.keys())  # noqa: SIM118
    from lorapod.export.inspect import inspect_file

    prompts = tmp_path / "p.txt"  # `lorapod eval`: base and each checkpoint at fixed seeds
    prompts.write_text("zxq, a red square --w 64 --h 64 --s 2 --d 5\n")
    res = evaluate_images(run.root, prompts, strengths=(1.0,), device="cpu", log=lambda m: None)
    assert [(c.row, c.strength) for c in res.grids[0].cells][:2] == [("base", 0.0), ("step-3", 1.0)]

    report = inspect_file(run.adapter / "t.safetensors")  # what `lorapod inspect` says of the ComfyUI file
    assert report["family"] == family
    assert report["consumers"]["ComfyUI"]["drops"] == [] and report["consumers"]["ComfyUI"]["loads"] == len(modules)
    plain = inspect_file(run.adapter / "pytorch_lora_weights.safetensors")  # no kohya metadata: read from names
    assert plain["family"] == family
    assert bool(plain["consumers"]["ComfyUI"]["drops"]) == (family == "zimage")  # ComfyUI maps Qwen's diffusers names
    if family == "zimage":  # ComfyUI's NextDiT names: q, k, v fused into qkv (rank 4 x 3), out, w1-w3
        assert modules == {f"lora_unet_layers_{i}_{m}" for i in range(2)
                           for m in ("attention_qkv", "attention_out", "feed_forward_w1", "feed_forward_w2",
                                     "feed_forward_w3")}
        assert (meta["ss_base_model_version"], meta["modelspec.architecture"]) == ("z_image", "Z-Image/lora")
    else:  # ComfyUI's Qwen-Image names are diffusers' own
        assert "lora_unet_transformer_blocks_1_attn_add_q_proj" in modules
        assert "lora_unet_transformer_blocks_0_img_mlp_net_0_proj" in modules and len(modules) == 2 * 12
        assert (meta["ss_base_model_version"], meta["modelspec.architecture"]) == ("qwen_image", "Qwen-Image/lora")


@pytest.mark.parametrize("family", ["zimage", "qwenimage"])
def test_a_run_stopped_mid_way_resumes_to_the_uninterrupted_losses(assets, tmp_path, family):
    spec, run = _run(assets, tmp_path, family, "a", epochs=2, noise_offset=0.1)
    straight = train_cpu(spec, run, tmp_path).result.losses
    spec2, run2 = _run(assets, tmp_path, family, "b", epochs=2, noise_offset=0.1)

    def crash(state, loss):
        if state.step == 5:
            raise Crash

    with pytest.raises(Crash):
        train_cpu(spec2, run2, tmp_path, on_step=crash)
    assert CheckpointManager(run2.checkpoints).latest().state.step == 3
    resumed = train_cpu(spec2, run2, tmp_path, resume=True).result.losses
    assert len(straight) == 6 and resumed == pytest.approx(straight[3:], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("family", ["zimage", "qwenimage"])
def test_block_swap_in_the_image_engine_gives_the_same_losses_from_one_host_buffer_per_block(assets, tmp_path, family):
    """N5: ``train.blocks_to_swap`` works in the image engine (it was read only by the video path, so
    the OOM hint's advice did nothing); N6: each swapped block's frozen weights are views of one host
    buffer (one pinned allocation per block, not one per weight)."""
    spec, run = _run(assets, tmp_path, family, "plain", max_steps=3)
    plain = train_cpu(spec, run, tmp_path).result.losses
    spec, run = _run(assets, tmp_path, family, "swapped", max_steps=3, blocks_to_swap=1)
    swapped = train_cpu(spec, run, tmp_path)
    swap = swapped.recipe.swap
    assert swap is not None and swap.moves > 6 and len(swap.blocks) == 1
    held = swap._frozen(swap.blocks[0])
    storages = {host.untyped_storage().data_ptr() for _, host in held}
    assert len(held) > 4 and len(storages) == 1
    assert swap.pinned == sum(host.untyped_storage().nbytes() for _, host in held[:1])
    assert all(prm.data.data_ptr() == host.data_ptr() for prm, host in held)  # between uses: the host view
    assert swapped.result.losses == pytest.approx(plain, rel=1e-5)


def test_block_swap_is_refused_for_a_u_net_and_past_the_last_block(assets, tmp_path):
    from lorapod.builtin.sd import build_sd15
    from lorapod.errors import SpecError

    sd = build_sd15(tmp_path / "sd15")
    raw = image_spec(sd, assets["data"], tmp_path / "r", "sd15", max_steps=1, blocks_to_swap=2)
    spec = load_spec(raw=raw)
    with pytest.raises(SpecError, match="no transformer blocks to swap"):
        train_cpu(spec, RunDir.create(spec.output.dir, "t"), tmp_path)
    spec, run = _run(assets, tmp_path, "zimage", "far", max_steps=1, blocks_to_swap=2)
    with pytest.raises(SpecError, match="at most 1"):
        train_cpu(spec, run, tmp_path)


def test_the_host_ram_check_counts_the_flat_buffers_and_refuses_what_does_not_fit():
    from lorapod.engine.diffusion import memory
    from lorapod.errors import HardwareError

    blocks = [torch.nn.Linear(100, 30), torch.nn.Linear(100, 30)]
    for b in blocks:
        b.requires_grad_(False)
    # one block: weight 3000 floats (12000 B) at 0, bias 30 floats at the next 64-byte boundary
    assert memory.pinned_bytes(blocks, 1) == 12032 + 120
    memory.host_ram_check(10**6, "x", available=3 * 1024**3)
    with pytest.raises(HardwareError, match=r"pins 1\.5 GiB of host RAM") as exc:
        memory.host_ram_check(int(1.5 * 1024**3), "block swap of 20 blocks", available=3 * 1024**3)
    assert "blocks_to_swap" in exc.value.hint
