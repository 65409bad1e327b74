"""The Wan engine end to end on tiny Wan2.1 / Wan2.2 pipelines built from configs: loss falls,
resume is exact, caches are reused, both exported files reload through diffusers to the trained
output, Wan2.2's experts train on their own noise ranges, and a job that cannot fit is refused."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from lorapod.builtin.wan import build_wan
from lorapod.demo_video import write_clips
from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.diffusion import memory as wanmod
from lorapod.errors import HardwareError
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .image_fixtures import Crash
from .image_fixtures import train_cpu as _train

pytest.importorskip("av")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    return {
        "wan21": build_wan(root / "wan21", "wan21"),
        "wan22": build_wan(root / "wan22", "wan22"),
        "wan21-i2v": build_wan(root / "wan21i2v", "wan21", i2v=True),
        "wan22-i2v": build_wan(root / "wan22i2v", "wan22", i2v=True),
        "data": write_clips(root / "data", n=2, frames=8, sizes=[(48, 48), (96, 48)], images=1),
    }


def _spec(assets, tmp_path, family="wan21", data=None, data_opts=None, **train):
    model = assets[family]
    family = family.removesuffix("-i2v")
    t = {"epochs": 2, "micro_batch_size": 1, "learning_rate": 5e-3, "seed": 0, "scheduler": "constant",
         "precision": "fp32", "timestep_sampling": "shift", "timestep_shift": 3.0}
    t.update(train)
    raw = {
        "model": {"id": str(model), "family": family},
        "method": {"r": 4, "alpha": 8, "dropout": 0.0},
        "data": {"path": str(data or assets["data"]), "format": "video", "resolution": 64, "trigger": "zxq",
                 "target_frames": [1, 5], "fps": 16},
        "train": t,
        "eval": {"max_batches": 1},
        "save": {"every_epochs": 1, "keep_last": 10},
        "output": {"dir": str(tmp_path / "runs"), "name": "t"},
    }
    raw["data"].update(data_opts or {})
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


def test_wan21_learns_samples_a_clip_and_writes_both_files(assets, tmp_path):
    spec, run = _spec(assets, tmp_path, epochs=6)
    spec.samples.prompts = ["zxq, a red square --w 32 --h 32 --f 5 --d 3 --s 2 --l 1"]
    spec.samples.every_epochs = 6
    out = _train(spec, run, tmp_path)
    first, last = out.result.first_eval["fixed_noise_loss"], out.result.last_eval["fixed_noise_loss"]
    assert last < 0.9 * first  # the LoRA learns the clips' latents
    # 2 clips x (1, 5 frames) + 1 image = 5 windows; buckets (frames, w, h)
    assert sorted(it.bucket for it in out.recipe.items) == [(1, 64, 64), (1, 64, 64), (1, 80, 48), (5, 64, 64), (5, 80, 48)]
    assert out.recipe.latents[(3, False)].shape[1] in (1, 2)  # 1 + (F-1)/4 latent frames
    clip = run.samples / "epoch006-00.mp4"
    from lorapod.data.clips import probe

    info = probe(clip)
    assert (info.frames, info.width, info.height) == (5, 32, 32)
    assert (run.samples / "epoch006-frames.png").is_file()
    with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
        keys = set(fh.keys())
        assert fh.get_tensor("lora_unet_blocks_0_self_attn_q.alpha").item() == 8.0
    assert {"lora_unet_blocks_1_cross_attn_o.lora_up.weight", "lora_unet_blocks_0_ffn_2.lora_down.weight"} <= keys
    assert (run.adapter / "pytorch_lora_weights.safetensors").is_file()
    cache = json.loads((run.root / "cache.json").read_text())
    pred, actual = cache["predicted_bytes"]["latents"], cache["actual_bytes"]["latents"]
    # z=4 fp32: 1-frame windows 4x1x8x8 (64x64) / 4x1x6x10 (80x48), 5-frame ones 2 latent frames
    assert pred == 4 * 4 * (2 * 64 + 60 + 2 * 64 + 2 * 60)
    assert 0 <= actual - pred <= 128 * 5  # + a safetensors header per file
    assert 0 < cache["actual_bytes"]["text"] <= cache["predicted_bytes"]["text_max"] + 128 * 3  # 3 captions


def test_wan22_resume_equals_the_uninterrupted_run(assets, tmp_path):
    spec, run = _spec(assets, tmp_path / "a", family="wan22", epochs=2)
    straight = _train(spec, run, tmp_path).result.losses
    spec2, run2 = _spec(assets, tmp_path / "b", family="wan22", epochs=2)

    def crash(state, loss):
        if state.step == 7:
            raise Crash

    with pytest.raises(Crash):
        _train(spec2, run2, tmp_path, on_step=crash)
    assert CheckpointManager(run2.checkpoints).latest().state.step == 5
    resumed = _train(spec2, run2, tmp_path, resume=True)
    assert len(straight) == 10
    assert resumed.result.losses == pytest.approx(straight[5:], rel=1e-5, abs=1e-6)
    assert set(resumed.recipe.lora_modules) == {"transformer", "transformer_2"}


def test_second_run_reads_every_latent_and_never_calls_the_vae_encoder(assets, tmp_path, monkeypatch):
    spec, run = _spec(assets, tmp_path / "a", max_steps=1)
    first = _train(spec, run, tmp_path)
    assert (first.cache_hits, first.cache_misses) == (0, 5 + 3)  # 5 windows, 3 captions
    from diffusers import AutoencoderKLWan

    def boom(*a, **k):
        raise AssertionError("the VAE encoder ran although every window was cached")

    monkeypatch.setattr(AutoencoderKLWan, "encode", boom)
    spec2, run2 = _spec(assets, tmp_path / "b", max_steps=1)
    second = _train(spec2, run2, tmp_path)
    assert (second.cache_hits, second.cache_misses) == (8, 0)
    assert second.result.losses == pytest.approx(first.result.losses, rel=1e-6)


def _forward_all(recipe, tr_by_name):
    """Each transformer's output on fixed inputs (a 5-frame window, sigma 0.5)."""
    b = next(b for b in recipe.epoch_batches(0) if recipe.items[b.items[0]].bucket[0] == 5)
    x0 = recipe.latents[(b.items[0], False)].unsqueeze(0)
    noisy = torch.randn(x0.shape, generator=torch.Generator().manual_seed(3))
    cond = recipe._cond(b)
    s = torch.tensor([0.5])
    return {n: recipe.family.forward(recipe.c, noisy, s, cond, {}, model=tr) for n, tr in tr_by_name.items()}


def _i2v_sample_frames(recipe, state) -> int:
    """Frames of an I2V sample clip started from the first training frame (no --i given)."""
    from lorapod.data.clips import probe
    from lorapod.engine.diffusion.video import load_video_prompts

    recipe.video_prompts = load_video_prompts(["zxq --w 32 --h 32 --f 5 --s 2 --l 1"], 64, 64, 0)
    return probe(recipe.write_samples(state, "i2v")[0]).frames


@pytest.mark.parametrize("family", ["wan21", "wan22", "wan21-i2v", "wan22-i2v"])
def test_exported_files_reload_through_diffusers_to_the_trained_output(assets, tmp_path, family):
    """I2V: the image keys/values (add_k_proj/add_v_proj -> k_img/v_img) travel too."""
    from diffusers import DiffusionPipeline

    spec, run = _spec(assets, tmp_path, family=family, max_steps=1)
    out = _train(spec, run, tmp_path)
    recipe = out.recipe
    g = torch.Generator().manual_seed(1)  # large random LoRA B so any alpha/naming mistake shows
    recipe.load_adapter_state({k: (torch.randn(v.shape, generator=g) * 0.3 if ".lora_B." in k else v)
                               for k, v in recipe.adapter_state().items()})
    recipe.save_final(run.adapter)
    for m in recipe.lora_modules.values():
        m.eval()
    two = family.startswith("wan22")
    names = ["transformer", "transformer_2"] if two else ["transformer"]
    with torch.no_grad():
        want = _forward_all(recipe, recipe.lora_modules)
        files = {"diffusers": ("pytorch_lora_weights_high_noise.safetensors", "pytorch_lora_weights_low_noise.safetensors")
                 if two else ("pytorch_lora_weights.safetensors",),
                 "comfy": ("t_high_noise.safetensors", "t_low_noise.safetensors") if two else ("t.safetensors",)}
        for kind, weights in files.items():
            pipe = DiffusionPipeline.from_pretrained(str(assets[family]))
            base = _forward_all(recipe, {n: getattr(pipe, n) for n in names})
            for n, w in zip(names, weights, strict=True):
                pipe.load_lora_weights(str(run.adapter), weight_name=w, adapter_name=n,
                                       **({"load_into_transformer_2": True} if n == "transformer_2" else {}))
            got = _forward_all(recipe, {n: getattr(pipe, n) for n in names})
            for n in names:
                delta = (want[n] - base[n]).abs().mean()
                assert delta > 1e-2, (kind, n)  # the adapter really changes the output
                assert (got[n] - want[n]).abs().mean() < 0.01 * delta, (kind, n)
    if family == "wan22-i2v":  # Wan2.2 I2V: the condition channels, no CLIP image states; both experts sample
        assert recipe.c.extra["i2v"] and set(recipe.conditions[(0, False)]) == {"condition"}
        assert _i2v_sample_frames(recipe, out.result.state) == 5
    if family == "wan21-i2v":
        assert recipe.c.extra["i2v"] and type(pipe).__name__ == "WanImageToVideoPipeline"
        cache = json.loads((run.root / "cache.json").read_text())  # + mask, first-frame latents, CLIP states
        assert 0 <= cache["actual_bytes"]["latents"] - cache["predicted_bytes"]["latents"] <= 256 * 5
        cond = recipe.conditions[(0, False)]
        assert cond["condition"].shape[0] == 4 + 4 and cond["image_embeds"].shape[-1] == 16  # mask + z; CLIP width
        with safe_open(str(run.adapter / "t.safetensors"), "pt") as fh:
            assert "lora_unet_blocks_0_cross_attn_k_img.lora_down.weight" in set(fh.keys())
        assert _i2v_sample_frames(recipe, out.result.state) == 5


def test_wan22_one_expert_trains_only_its_noise_range(assets, tmp_path):
    """Also the live path: umT5 run per batch (caption shuffle on), latents kept in memory, flips."""
    opts = {"cache_text_encoder_outputs": False, "cache_latents": False, "shuffle_captions": True, "flip": True}
    spec, run = _spec(assets, tmp_path, family="wan22", data_opts=opts, max_steps=2, experts="low_noise")
    out = _train(spec, run, tmp_path)
    rec = out.recipe
    assert rec.live_captions and rec.text is None and len(rec.latents) == 2 * 5
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))
    assert set(rec.lora_modules) == {"transformer_2"}
    s = rec._sigmas(1000, torch.Generator().manual_seed(0))
    assert float(s.max()) < 0.875 and float(s.min()) >= 0.0  # boundary_ratio of the tiny pipeline
    assert all(k.startswith("transformer_2.") for k in rec.adapter_state())
    assert set(rec.idle) == {"transformer"}  # the high-noise expert waits in CPU RAM, used only to sample
    assert [p.name for p in run.adapter.iterdir() if p.suffix == ".safetensors"] and not (
        run.adapter / "pytorch_lora_weights_high_noise.safetensors").exists()


def test_block_swap_runs_through_its_hooks_and_changes_nothing_numerically(assets, tmp_path):
    spec, run = _spec(assets, tmp_path / "a", max_steps=3)
    plain = _train(spec, run, tmp_path).result.losses
    spec2, run2 = _spec(assets, tmp_path / "b", max_steps=3, blocks_to_swap=1)
    swapped = _train(spec2, run2, tmp_path)
    swap = swapped.recipe.swaps[0]
    assert swap.moves > 6  # load + drop around each forward and each recompute
    held = [(prm, host) for prm, host in swap._frozen(swap.blocks[0])]
    assert held and all(prm.data.data_ptr() == host.data_ptr() for prm, host in held)  # between uses: the host copy
    assert swapped.recipe.c.denoiser.is_gradient_checkpointing
    assert swapped.result.losses == pytest.approx(plain, rel=1e-5)


class _Probe(wanmod.BlockSwap):
    """The review's D1 probe (the GPU review of 2026-12-02): a load that makes a copy (as the
    GPU copy is one) and a drop that leaves NaN behind, so that on a CPU a weight still loaded after
    the backward pass, or read by it after its drop, shows."""

    def _load(self, block):
        for prm, host in self._frozen(block):
            prm.data = host.clone()
        self.moves += 1

    def _drop(self, block):
        for prm, host in self._frozen(block):
            prm.data = torch.full_like(host, float("nan"))
        self.moves += 1


def _one_step_grads(assets, tmp_path, monkeypatch, **train):
    """One forward and backward of the engine's own recipe (prepare_video, as a run builds it)."""
    from lorapod.engine.diffusion.video import prepare_video

    monkeypatch.setattr(wanmod, "BlockSwap", _Probe)
    spec, run = _spec(assets, tmp_path, max_steps=1, **train)
    spec = spec.model_copy(update={"method": spec.method.model_copy(update={"dropout": 0.1})})
    recipe, _, _ = prepare_video(spec, run, device="cpu", log=lambda m: None, cache_root=tmp_path / "cache")
    recipe.train()
    batch = recipe.epoch_batches(0)[0]
    recipe.loss(batch).loss_sum.backward()
    grads = {n: p.grad.clone() for n, p in recipe.c.denoiser.named_parameters() if p.requires_grad}
    return recipe, grads


@pytest.mark.parametrize("early_stop", [True, False])
def test_block_swap_drops_each_block_after_its_backward_and_backward_reads_loaded_weights(
        assets, tmp_path, monkeypatch, early_stop):
    """G1: torch's checkpoint stops recomputing at the last saved tensor, before the drop hook, so
    with diffusers' checkpointing every swapped block stayed loaded after backward (the probe: all
    of them); with early stop off the drop ran inside the recomputation and the backward read the
    dropped (here NaN) weights. Now: none left loaded, gradients finite and equal to the run without
    block swap (LoRA dropout on, so the recomputation must replay the forward's random draws)."""
    from torch.utils.checkpoint import set_checkpoint_early_stop

    _, plain = _one_step_grads(assets, tmp_path / "plain", monkeypatch, gradient_checkpointing=True)
    with set_checkpoint_early_stop(early_stop):
        recipe, grads = _one_step_grads(assets, tmp_path / "swap", monkeypatch, blocks_to_swap=1)
    swap = recipe.swaps[0]
    frozen = swap._frozen(swap.blocks[0])
    assert frozen and isinstance(swap, _Probe)
    loaded = [p for p, host in frozen if p.data.data_ptr() != host.data_ptr() and torch.isfinite(p.data).all()]
    assert not loaded, f"{len(loaded)}/{len(frozen)} swapped weights still on the device after backward"
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads.keys() == plain.keys()
    for n, g in grads.items():
        assert torch.allclose(g, plain[n], rtol=1e-4, atol=1e-7), n


class _Streams:
    """Stands in for ``wan.CudaStreams`` (its three methods) on a CPU and logs what would run on the
    side stream and when the compute stream would wait for it."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.on_side = False

    @contextlib.contextmanager
    def side(self):
        self.on_side = True
        try:
            yield
        finally:
            self.on_side = False

    def record(self):
        return object()

    def use(self, tensors, event):
        self.log.append(("wait", len(tensors)))


def test_block_swap_prefetches_the_next_block_on_the_side_stream_while_one_computes():
    """G12: each swapped block's copy is issued on the side stream before the block ahead of it
    (forward: the previous one, backward: the next one) computes, and is waited for before its own
    use; no copy runs on the compute stream, and after the backward nothing is left on the device
    or in flight (the resident block's recomputation does not fetch the next step's block early)."""
    from lorapod.builtin.wan import tiny_wan_transformer
    from lorapod.engine.diffusion.families.wan import WAN_TARGETS
    from lorapod.engine.diffusion.lora import attach_lora

    log: list = []

    class Logged(wanmod.BlockSwap):
        def _copy(self, host):
            i = next(k for k, b in enumerate(self.blocks) if any(h is host for _, h in self._frozen(b)))
            e = ("side" if self.streams.on_side else "sync", i)
            if self.log[-1:] != [e]:  # one entry per block, not per weight
                self.log.append(e)
            return host.clone()

    from peft import LoraConfig

    tr = tiny_wan_transformer(layers=4)
    attach_lora(tr, LoraConfig(r=2, lora_alpha=2, target_modules=WAN_TARGETS, init_lora_weights="gaussian"))
    tr.requires_grad_(False)
    for n, p in tr.named_parameters():
        p.requires_grad_("lora_" in n)
    swap = Logged(tr.blocks, 3, torch.device("cpu"), streams=_Streams(log))
    swap.log = log
    for k, b in enumerate(tr.blocks):
        b.register_forward_pre_hook(lambda m, a, k=k: log.append(("compute", k - 1)))
    tr.enable_gradient_checkpointing(swap.checkpoint)
    x = torch.randn(1, 4, 1, 8, 8)
    out = tr(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=torch.randn(1, 16, 32)).sample
    fwd = len(log)
    out.square().mean().backward()
    assert ("sync", 0) not in log and not [e for e in log if e[0] == "sync"]
    forward, backward = log[:fwd], log[fwd:]
    for i in range(3):  # forward: block i's copy issued before block i-1 computes, waited for before block i
        assert forward.index(("side", i)) < forward.index(("compute", i - 1)) < forward.index(("compute", i))
    assert [e for e in forward if e[0] == "wait"] == [("wait", len(swap._frozen(swap.blocks[0])))] * 3
    assert forward[-1] == ("side", 2)  # fetched again for the backward, which starts with it
    steps = [e for e in backward if e[0] in ("side", "compute")]
    assert steps == [("side", 1), ("compute", 2), ("side", 0), ("compute", 1), ("compute", 0), ("compute", -1)]
    assert not swap._pending and not swap._loaded
    assert all(torch.isfinite(p.grad).all() for p in tr.parameters() if p.requires_grad)


def test_block_swap_refuses_a_grad_forward_outside_its_own_checkpointing():
    """diffusers' own checkpointing (or none) would keep every swapped block's weights on the GPU
    after its forward: a loud error naming the fix, not a swap that silently saves nothing."""
    from lorapod.builtin.wan import tiny_wan_transformer

    tr = tiny_wan_transformer(layers=2)
    tr.requires_grad_(False)
    tr.proj_out.weight.requires_grad_(True)
    wanmod.BlockSwap(tr.blocks, 1, torch.device("cpu"))
    tr.enable_gradient_checkpointing()
    args = {"hidden_states": torch.randn(1, 4, 1, 8, 8), "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, 16, 32)}
    with torch.no_grad():
        tr(**args)  # sampling and evaluation: the hooks alone
    with pytest.raises(RuntimeError, match=r"enable_gradient_checkpointing\(swap\.checkpoint\)"):
        tr(**args)


def test_block_swap_removed_leaves_every_block_resident_through_forward_and_backward():
    """After ``remove`` the swap's checkpoint function is torch's plain one: a backward must not drop
    (here: poison) the blocks it loaded back."""
    from peft import LoraConfig

    from lorapod.builtin.wan import tiny_wan_transformer
    from lorapod.engine.diffusion.families.wan import WAN_TARGETS
    from lorapod.engine.diffusion.lora import attach_lora

    tr = tiny_wan_transformer(layers=3)
    tr.requires_grad_(False)
    attach_lora(tr, LoraConfig(r=2, lora_alpha=2, target_modules=WAN_TARGETS, init_lora_weights="gaussian"))
    swap = wanmod.swap_blocks(tr, 2, torch.device("cpu"))
    swap.__class__ = _Probe
    args = {"hidden_states": torch.randn(1, 4, 1, 8, 8), "timestep": torch.tensor([500.0]),
            "encoder_hidden_states": torch.randn(1, 16, 32)}
    tr(**args).sample.square().mean().backward()
    swap.remove()
    for _ in range(2):
        tr(**args).sample.square().mean().backward()
    frozen = [p for b in swap.blocks for p, _ in swap._frozen(b)]
    assert frozen and all(torch.isfinite(p).all() for p in frozen)
    assert all(torch.isfinite(p.grad).all() for p in tr.parameters() if p.requires_grad)


def test_wan22_idle_expert_samples_block_by_block_and_is_never_moved_whole(assets, tmp_path, monkeypatch):
    """G16: with one Wan2.2 expert trained, the other waits in CPU RAM; to sample it used to go to
    the device whole (``tr.to(device)``: a 14B expert beside the trained one on a 24 GB card). Now
    it samples through a block swap: ``.to`` is never called on it (recorded), its swapped blocks
    are loaded only around their own forward (the D1 probe: NaN after a drop, so a block read
    unloaded would give a NaN clip) and nothing stays loaded afterwards."""
    from lorapod.data.clips import probe
    from lorapod.engine.checkpoint import TrainState
    from lorapod.engine.diffusion.video import prepare_video

    monkeypatch.setattr(wanmod, "BlockSwap", _Probe)
    spec, run = _spec(assets, tmp_path, family="wan22", max_steps=1, experts="low_noise")
    spec.samples.prompts = ["zxq, a red square --w 32 --h 32 --f 5 --d 3 --s 3 --l 1"]
    recipe, _, _ = prepare_video(spec, run, device="cpu", log=lambda m: None, cache_root=tmp_path / "cache")
    idle = recipe.idle["transformer"]
    moved = []
    monkeypatch.setattr(idle, "to", lambda *a, **k: moved.append((a, k)) or idle)
    uses = []
    for b in idle.blocks:
        b.register_forward_hook(lambda m, a, out: uses.append(torch.isfinite(out).all().item()))
    clip = recipe.write_samples(TrainState(step=1), "t")[0]
    assert not moved
    swap = recipe._idle_swaps["transformer"]
    assert isinstance(swap, _Probe) and len(swap.blocks) == len(idle.blocks) - 1 and swap.moves > 0
    assert uses and all(uses)
    assert all(not torch.isfinite(p.data).all() for b in swap.blocks for p, _ in swap._frozen(b))  # all dropped
    assert probe(clip).frames == 5


def test_wan_timesteps_reach_a_bf16_transformer_in_fp32(assets, tmp_path):
    """G23: sigma was cast to the transformer's dtype before ``* 1000``: bf16 (8 mantissa bits)
    rounds the timesteps to steps of 4 above 512, where WanPipeline feeds fp32 timesteps."""
    from lorapod.engine.diffusion.video import prepare_video

    spec, run = _spec(assets, tmp_path, max_steps=1)
    recipe, _, _ = prepare_video(spec, run, device="cpu", log=lambda m: None, cache_root=tmp_path / "cache")
    tr = recipe.c.denoiser.to(torch.bfloat16)
    seen = []
    tr.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["timestep"]), with_kwargs=True)
    t = torch.tensor([0.6013])
    with torch.no_grad():
        recipe.per_sample_loss(recipe.epoch_batches(0)[0], 0, fixed_t=t)
    assert seen[0].dtype == torch.float32
    assert float(seen[0][0]) == pytest.approx(601.3, abs=1e-3)


WAN14B = {"num_attention_heads": 40, "attention_head_dim": 128, "ffn_dim": 13824, "num_layers": 40,
          "text_dim": 4096, "freq_dim": 256, "in_channels": 16, "patch_size": [1, 2, 2]}


def _wan14b(experts: int = 1):
    """The planner's model of a Wan2.1 14B transformer config (catalog.models.wan_model_from_config)."""
    from lorapod.catalog.models import find_model, wan_model_from_config

    return wan_model_from_config(find_model("wan21-14b"), WAN14B, experts=experts)


def _fits(model, gpu_gb, *, fp8, blocks_to_swap, tokens, rank, experts="both"):
    from lorapod.plan.vram import Settings, check_fits

    s = Settings(base_dtype="fp8" if fp8 else "bf16", r=rank, targets="all-linear", optimizer="adamw",
                 gradient_checkpointing=True, batch=1, resolution=960, blocks_to_swap=blocks_to_swap,
                 image_tokens=tokens, experts=experts)
    return check_fits(model, s, gpu_gb)


def test_a_14b_job_that_cannot_fit_even_with_block_swap_is_refused():
    model = _wan14b()
    tokens = model.window_tokens(81, 960, 960)
    assert tokens == 21 * 60 * 60
    with pytest.raises(HardwareError, match="even with 39 of 40 blocks swapped") as exc:
        _fits(model, 16.0, fp8=True, blocks_to_swap=0, tokens=tokens, rank=32)
    assert "target_frames" in exc.value.hint
    # 960x960 stills in bf16 (no fp8 on this card) fit 24 GB only with blocks swapped: the hint says how many
    still = model.window_tokens(1, 960, 960)
    with pytest.raises(HardwareError, match="blocks_to_swap: 0") as exc:
        _fits(model, 24.0, fp8=False, blocks_to_swap=0, tokens=still, rank=32)
    k = int(exc.value.hint.split("blocks_to_swap: ")[1].split()[0])
    assert 0 < k < 40
    _fits(model, 24.0, fp8=False, blocks_to_swap=k, tokens=still, rank=32)  # fits
    with pytest.raises(HardwareError):
        _fits(model, 24.0, fp8=False, blocks_to_swap=k - 1, tokens=still, rank=32)
    _fits(model, 80.0, fp8=True, blocks_to_swap=0, tokens=still, rank=32)  # an H100 without swap


def test_wan22_with_both_experts_resident_needs_room_for_two(tmp_path):
    """Wan2.2 A14B keeps both experts on the GPU when it trains both: the fit check counts two sets of
    resident weights and LoRA state, and one set of activations (one expert runs per step)."""
    from lorapod.catalog.models import find_model
    from lorapod.plan.vram import Settings, resident_experts

    still = _wan14b().window_tokens(1, 960, 960)
    one = _fits(_wan14b(), 200.0, fp8=True, blocks_to_swap=0, tokens=still, rank=32)
    two = _fits(_wan14b(experts=2), 200.0, fp8=True, blocks_to_swap=0, tokens=still, rank=32)
    weights = next(k for k in one.parts if k.startswith("base weights"))
    lora = "LoRA weights, grads, optimizer"
    assert two.parts[next(k for k in two.parts if k.startswith("base weights"))] == pytest.approx(2 * one.parts[weights], 1e-3)
    assert two.parts[lora] == pytest.approx(2 * one.parts[lora], 1e-3)
    assert two.parts["activations"] == one.parts["activations"]
    card = (one.peak_gb + two.peak_gb) / 2  # room for one expert, not for two
    _fits(_wan14b(experts=2), card, fp8=True, blocks_to_swap=0, tokens=still, rank=32, experts="low_noise")
    with pytest.raises(HardwareError, match="blocks_to_swap: 0"):
        _fits(_wan14b(experts=2), card, fp8=True, blocks_to_swap=0, tokens=still, rank=32)
    # which experts are resident: read from the model's own folder (a transformer_2 is Wan2.2 A14B)
    folder = tmp_path / "wan22"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "config.json").write_text(json.dumps(WAN14B))
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "boundary_ratio": 0.875}))
    both = Settings(base_dtype="fp8", r=32, targets="all-linear", optimizer="adamw", gradient_checkpointing=True,
                    batch=1)
    assert resident_experts(find_model(str(folder)), both) == 1
    (folder / "transformer_2").mkdir()
    (folder / "transformer_2" / "config.json").write_text(json.dumps(WAN14B))
    assert resident_experts(find_model(str(folder)), both) == 2
    assert resident_experts(find_model(str(folder)), replace(both, experts="low_noise")) == 1


def test_fp8_storage_covers_the_wan_blocks_and_keeps_the_output_close(assets):
    """model.dtype fp8 (on Ada/Hopper): the Linear layers inside ``blocks.N`` are stored in float8 and
    upcast per call; checked on CPU, where float8 storage and casts work too."""
    from diffusers import WanTransformer3DModel

    tr = WanTransformer3DModel.from_pretrained(str(assets["wan21"]), subfolder="transformer")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 2, 8, 8, generator=g)
    pe = torch.randn(1, 16, 32, generator=g)
    t = torch.tensor([500.0])
    with torch.no_grad():
        want = tr(hidden_states=x, timestep=t, encoder_hidden_states=pe).sample
        n = wanmod.store_fp8(tr)
        got = tr(hidden_states=x, timestep=t, encoder_hidden_states=pe).sample
    per_block = 4 + 4 + 2  # self- and cross-attention q/k/v/out, feed-forward in/out
    assert n == 2 * per_block
    assert tr.blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
    assert tr.proj_out.weight.dtype == torch.float32  # outside the blocks: untouched
    assert (got - want).abs().mean() < 0.05 * want.abs().mean()


def test_training_text_is_what_wanpipeline_samples_with_whatever_the_tokenizer_says(assets):
    """WanPipeline pads every prompt to 512 tokens, whatever ``model_max_length`` its tokenizer has
    (the tiny one here says 16); training on other padding teaches the cross-attention a different
    number of padding keys than every pipeline (diffusers, ComfyUI) samples with."""
    from diffusers import WanPipeline

    from lorapod.engine.diffusion.families import Wan21

    pipe = WanPipeline.from_pretrained(str(assets["wan21"]))
    assert pipe.tokenizer.model_max_length == 16
    fam = Wan21()
    c = fam.components(pipe, str(assets["wan21"]))
    ours = fam.encode_text(c, ["zxq, a red square"], torch.device("cpu"))["prompt_embeds"]
    with torch.no_grad():
        theirs, _ = pipe.encode_prompt("zxq, a red square", do_classifier_free_guidance=False, max_sequence_length=512)
    assert ours.shape == theirs.shape == (1, 512, 32)
    assert torch.allclose(ours, theirs, atol=1e-6)
