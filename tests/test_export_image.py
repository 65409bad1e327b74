"""Image LoRA files judged by their consumers: ComfyUI (tests/comfy_consumer.py, its key rules) and
diffusers' own ``load_lora_weights``, on tiny SD 1.5, SDXL, FLUX.1 and FLUX.2 klein pipelines.

No training: LoRA is attached with random ``lora_B`` so that any wrong name, alpha or slice shows
as a weight that differs from base + adapter."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorapod.builtin.sd import build_flux1, build_flux2_klein, build_sd15, build_sdxl
from lorapod.engine.diffusion import attach_lora
from lorapod.engine.diffusion.families import FAMILIES
from lorapod.export import kohya
from lorapod.export.diffusers import save_diffusers
from lorapod.export.inspect import inspect_file

from . import comfy_consumer as comfy

torch.set_num_threads(1)
BUILD = {"sd15": build_sd15, "sdxl": build_sdxl, "flux1": build_flux1, "flux2": build_flux2_klein}
TE_NAMES = {"sd15": [["lora_te", "lora_te1"]], "sdxl": [["lora_te1"], ["lora_te2"]]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp")
    return {f: b(root / f) for f, b in BUILD.items()}


def _pipe(models, family):
    fam = FAMILIES[family]()
    pipe = fam.pipeline_cls().from_pretrained(str(models[family]))
    return fam, pipe, fam.components(pipe, "x")


def _lora(models, family, alpha=8.0, rslora=False, te=True, seed=0):
    """A pipeline with LoRA on the default targets (+ text encoders), random B; returns
    (components, {component: module}, PEFT parts, expected merged weights)."""
    from peft import LoraConfig, get_peft_model_state_dict

    fam, _, c = _pipe(models, family)
    mods = {fam.denoiser_name: c.denoiser}
    if te and fam.kohya_te_prefixes:
        mods.update({"text_encoder" if i == 0 else f"text_encoder_{i + 1}": t for i, t in enumerate(c.text_encoders)})
    g = torch.Generator().manual_seed(seed)
    for name, m in mods.items():
        targets = fam.default_targets if name == fam.denoiser_name else fam.te_targets
        attach_lora(m, LoraConfig(r=4, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                                  init_lora_weights="gaussian"))
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    parts = {name: get_peft_model_state_dict(m) for name, m in mods.items()}
    want = {}
    for name, m in mods.items():
        for path, layer in m.named_modules():
            if hasattr(layer, "get_delta_weight") and "default" in getattr(layer, "lora_A", {}):
                want[(name, path)] = (layer.get_base_layer().weight + layer.get_delta_weight("default")).detach()
    return c, mods, parts, want


def _comfy_map(family, c):
    fam = FAMILIES[family]()
    if fam.denoiser_name == "unet":
        key_map = comfy.unet_keys(c.denoiser)
    else:
        key_map = comfy.flux_keys(c.denoiser, flux2=family == "flux2")
    for i, names in enumerate(TE_NAMES.get(family, [])):
        key_map |= comfy.clip_keys(c.text_encoders[i], "text_encoder" if i == 0 else f"text_encoder_{i + 1}", names)
    return key_map


def _assert_weights(modules, want, atol=2e-3):
    for (comp, path), w in want.items():
        got = modules[comp].get_submodule(path)
        got = got.get_base_layer().weight if hasattr(got, "get_base_layer") else got.weight
        assert torch.allclose(got.float(), w.float(), atol=atol), f"{comp}.{path}"


def _fresh_modules(models, family):
    fam, pipe, c = _pipe(models, family)
    mods = {fam.denoiser_name: c.denoiser}
    mods.update({"text_encoder" if i == 0 else f"text_encoder_{i + 1}": t for i, t in enumerate(c.text_encoders)})
    return pipe, c, mods


@pytest.mark.parametrize("family,rslora", [("sd15", False), ("sdxl", True), ("flux1", False), ("flux2", True)])
def test_comfyui_loads_every_kohya_key_at_the_trained_strength(models, family, rslora, tmp_path):
    c, _mods, parts, want = _lora(models, family, rslora=rslora)
    sizes = {n: m.out_features for n, m in c.denoiser.named_modules() if hasattr(m, "out_features")}
    tensors = kohya.to_kohya(parts, family, 8.0, rslora, dtype=torch.float32, out_features=sizes)
    _pipe2, c2, fresh = _fresh_modules(models, family)
    patches, dropped = comfy.load(tensors, _comfy_map(family, c2))
    assert dropped == []
    comfy.apply(fresh, patches)
    _assert_weights(fresh, want)
    # and `lorapod inspect` (name rules only, no model) agrees: nothing dropped, by either consumer
    save_file(tensors, str(tmp_path / "k.safetensors"))
    report = inspect_file(tmp_path / "k.safetensors")
    assert report["consumers"]["ComfyUI"]["drops"] == [] and report["consumers"]["diffusers"]["drops"] == []


def test_text_encoder_keys_are_the_exact_names_comfyui_and_a1111_expect(models):
    """Under transformers 4.x and 5.x alike (5.x has no ``text_model.`` level in CLIPTextModel)."""
    layers = ["self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj"]
    for family, prefixes in (("sd15", ["lora_te"]), ("sdxl", ["lora_te1", "lora_te2"])):
        _c, _m, parts, _w = _lora(models, family)
        names = {k.split(".")[0] for k in kohya.to_kohya(parts, family, 8.0, False) if k.startswith("lora_te")}
        assert names == {f"{p}_text_model_encoder_layers_{b}_{x}" for p in prefixes for b in range(2) for x in layers}


def test_flux_kohya_names_are_sd_scripts_bfl_names(models):
    _c, _m, parts, _w = _lora(models, "flux1")
    t = kohya.to_kohya(parts, "flux1", 8.0, False)
    names = {k.rsplit(".", 2)[0] if k.endswith("weight") else k[: -len(".alpha")] for k in t}
    assert names == {"lora_unet_double_blocks_0_img_attn_qkv", "lora_unet_double_blocks_0_txt_attn_qkv",
                     "lora_unet_double_blocks_0_img_attn_proj", "lora_unet_double_blocks_0_txt_attn_proj",
                     "lora_unet_double_blocks_0_img_mlp_0", "lora_unet_double_blocks_0_img_mlp_2",
                     "lora_unet_double_blocks_0_txt_mlp_0", "lora_unet_double_blocks_0_txt_mlp_2",
                     "lora_unet_single_blocks_0_linear1"}
    # q, k, v fused at rank 3 x 4: alpha is the trained scale (8/4) times the fused rank
    assert t["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].shape[0] == 12
    assert float(t["lora_unet_double_blocks_0_img_attn_qkv.alpha"]) == pytest.approx(24.0)
    assert t["lora_unet_single_blocks_0_linear1.lora_down.weight"].shape[0] == 16


@pytest.mark.parametrize("family", ["sd15", "sdxl", "flux2"])
def test_diffusers_loads_the_kohya_file_to_base_plus_adapter(models, family, tmp_path):
    """FLUX.1 is left out here: diffusers' sd-scripts converter hard-codes FLUX.1's real sizes
    (3072 / 12288) for ``linear1``, which a tiny model cannot have; ComfyUI's test covers it."""
    _c, _m, parts, want = _lora(models, family, rslora=family == "sdxl")
    save_file(kohya.to_kohya(parts, family, 8.0, family == "sdxl", dtype=torch.float32), str(tmp_path / "k.safetensors"))
    pipe, _c2, fresh = _fresh_modules(models, family)
    pipe.load_lora_weights(str(tmp_path), weight_name="k.safetensors")
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    _assert_weights(fresh, want)


def test_comfyui_drops_diffusers_file_attention_keys_and_finds_no_alpha(models, tmp_path):
    """Why the diffusers file is not offered for ComfyUI (and why inspect says so)."""
    from peft import LoraConfig

    c, _m, parts, _w = _lora(models, "sd15", te=False)
    cfg = LoraConfig(r=4, lora_alpha=8.0, target_modules=FAMILIES["sd15"].default_targets).to_dict()
    save_diffusers(tmp_path, FAMILIES["sd15"]().pipeline_cls(), parts, {"unet": cfg})
    tensors = load_file(str(tmp_path / "pytorch_lora_weights.safetensors"))
    _patches, dropped = comfy.load(tensors, _comfy_map("sd15", c))
    assert any(".attn1.to_q.lora_A" in k for k in dropped)
    assert not any(k.endswith(".alpha") for k in tensors)


@pytest.mark.parametrize("family", ["sd15", "sdxl", "flux1", "flux2"])
def test_kohya_back_to_peft_is_exact(models, family):
    c, mods, parts, _w = _lora(models, family)
    sizes = {n: m.out_features for n, m in c.denoiser.named_modules() if hasattr(m, "out_features")}
    tensors = kohya.to_kohya(parts, family, 8.0, False, dtype=torch.float32, out_features=sizes)
    names = {comp: [n for n, _ in m.named_modules()] for comp, m in mods.items()}
    back, dropped = kohya.from_kohya(tensors, family, names)
    assert dropped == []
    scale = 8.0 / 4
    for comp, sd in parts.items():
        assert set(back[comp]) == set(sd)
        for k, v in sd.items():
            want = v * scale if ".lora_B." in k else v
            assert torch.allclose(back[comp][k], want, atol=1e-6), k


def _run_folder(models, family, root):
    """A run folder with two checkpoints (random LoRA weights, no training)."""
    from lorapod.engine.checkpoint import CheckpointManager, TrainState
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    from .image_fixtures import image_spec, write_images

    spec = load_spec(raw=image_spec(models[family], write_images(root / "data"), root / "runs", family))
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    mgr = CheckpointManager(run.checkpoints, keep_last=5)
    den = FAMILIES[family]().denoiser_name
    for step, seed in ((1, 1), (2, 2)):
        _c, _m, parts, _w = _lora(models, family, alpha=8.0, te=False, seed=seed)
        mgr.save(TrainState(step=step), {f"{den}.{k}": v for k, v in parts[den].items()}, {})
    return run.root


@pytest.fixture(scope="module")
def sd15_run(models, tmp_path_factory):
    return _run_folder(models, "sd15", tmp_path_factory.mktemp("sdrun"))


def test_flux2_run_exports_merged_and_comfyui(models, tmp_path):
    from lorapod.export.targets import export_run

    run = _run_folder(models, "flux2", tmp_path / "f2")
    export_run(run, "merged", out=tmp_path / "m")
    state = load_file(str(run / "checkpoints" / "step-2" / "adapter.safetensors"))
    fam = FAMILIES["flux2"]()
    base = fam.pipeline_cls().from_pretrained(str(models["flux2"])).transformer
    merged = fam.pipeline_cls().from_pretrained(str(tmp_path / "m")).transformer
    module = "single_transformer_blocks.0.attn.to_qkv_mlp_proj"
    a, b = state[f"transformer.{module}.lora_A.weight"], state[f"transformer.{module}.lora_B.weight"]
    assert torch.allclose(merged.get_submodule(module).weight, base.get_submodule(module).weight + 2.0 * b @ a, atol=1e-5)
    done = export_run(run, "comfyui", out=tmp_path / "c")
    report = inspect_file(done.out / "t.safetensors")
    assert report["family"] == "flux2" and report["consumers"]["ComfyUI"]["drops"] == []


def test_export_cli_writes_comfyui_diffusers_and_merged_files(models, sd15_run, tmp_path):
    from typer.testing import CliRunner

    from lorapod.cli.main import build_app
    from lorapod.export.targets import export_run

    res = CliRunner().invoke(build_app(), ["export", str(sd15_run), "--to", "comfyui", "--checkpoint", "1",
                                           "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    report = inspect_file(tmp_path / "c" / "t.safetensors")
    assert report["consumers"]["ComfyUI"]["drops"] == [] and report["consumers"]["ComfyUI"]["scale"] == [2.0]
    assert report["metadata"]["ss_network_alpha"] == "8.0" and report["family"] == "sd15"

    state = load_file(str(sd15_run / "checkpoints" / "step-2" / "adapter.safetensors"))
    export_run(sd15_run, "diffusers", out=tmp_path / "d")
    export_run(sd15_run, "merged", out=tmp_path / "m")
    fam = FAMILIES["sd15"]()
    base = fam.pipeline_cls().from_pretrained(str(models["sd15"])).unet
    merged = fam.pipeline_cls().from_pretrained(str(tmp_path / "m")).unet
    module = next(k for k in state if k.endswith("attn1.to_q.lora_A.weight"))[len("unet."):-len(".lora_A.weight")]
    a, b = state[f"unet.{module}.lora_A.weight"], state[f"unet.{module}.lora_B.weight"]
    want = base.get_submodule(module).weight + 8.0 / 4 * b @ a
    assert torch.allclose(merged.get_submodule(module).weight, want, atol=1e-5)
    pipe = fam.pipeline_cls().from_pretrained(str(models["sd15"]))
    pipe.load_lora_weights(str(tmp_path / "d"), weight_name="pytorch_lora_weights.safetensors")
    pipe.fuse_lora()
    assert torch.allclose(pipe.unet.get_submodule(module).base_layer.weight
                          if hasattr(pipe.unet.get_submodule(module), "base_layer")
                          else pipe.unet.get_submodule(module).weight, want, atol=1e-5)
    with pytest.raises(Exception, match="--to gguf is not available for an image run"):
        export_run(sd15_run, "gguf")


def test_image_eval_grids_with_fixed_seeds_and_leakage_against_the_base(sd15_run, tmp_path, monkeypatch):
    import shutil

    from lorapod.evaluate.images import evaluate_images

    run = tmp_path / "run"
    shutil.copytree(sd15_run, run)
    prompts = tmp_path / "p.txt"
    prompts.write_text("zxq in a park --s 2 --d 5\na red car --s 2 --d 5\n")
    import numpy as np

    import lorapod.engine.diffusion.samples as ev  # evaluate/images.py imports grid, labelled_grid from it

    laid_out: list[tuple[list, list[str]]] = []  # what each grid is drawn from: its cells and row labels
    real_grid, real_labelled = ev.grid, ev.labelled_grid
    monkeypatch.setattr(ev, "grid", lambda images, cols=None: (laid_out.append((list(images), [])),
                                                               real_grid(images, cols=cols))[1])
    monkeypatch.setattr(ev, "labelled_grid", lambda img, rows, *a, **k: (laid_out[-1][1].extend(rows),
                                                                        real_labelled(img, rows, *a, **k))[1])
    res = evaluate_images(run, prompts, strengths=(0.5, 1.0), device="cpu", log=lambda m: None)
    # issue 48, F9: the base row is the base image under every strength (strength does not apply to
    # it), labelled as the model without the LoRA, not one image under "0.5" and a blank under "1.0"
    for images, rows in laid_out:
        assert rows[0] == "base (no LoRA)"
        assert all(np.array_equal(np.asarray(images[0]), np.asarray(im)) for im in images[:2])
    assert [g.leakage_prompt for g in res.grids] == [False, True]
    cells = res.grids[1].cells
    assert [(c.row, c.strength) for c in cells] == [("base", 0.0), ("step-1", 0.5), ("step-1", 1.0),
                                                   ("step-2", 0.5), ("step-2", 1.0)]
    assert all(c.leakage is not None and c.leakage > 0 for c in cells[1:])
    assert all(c.leakage is None for c in res.grids[0].cells)
    page = (run / "eval" / "images.html").read_text()
    assert "No CLIP model given" in page and page.count("<table>") == 2
    for g in res.grids:
        assert (run / "eval" / g.grid).read_bytes()[:4] == b"\x89PNG"
    # this run folder was written without training (no metrics.jsonl): eval says why it recommends none
    assert res.best is None and "no loss logged at the checkpoints' steps" in res.reason
    assert "no checkpoint recommended: no loss logged" in page


def test_image_eval_through_the_cli_recommends_a_checkpoint_without_clip(sd15_run, tmp_path, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from lorapod.cli.main import build_app

    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    shutil.copytree(sd15_run, run)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red car --s 1 --d 5\n")
    (run / "metrics.jsonl").write_text(  # as training logs it: a loss per step
        '{"step": 1, "epoch": 0.5, "loss": 0.31}\n{"step": 2, "epoch": 1.0, "loss": 0.22}\n')
    r = CliRunner().invoke(build_app(), ["eval", str(run), "--prompts", str(prompts), "--strengths", "1.0",
                                         "--device", "cpu"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "recommended: step-2 (training loss" in said and "no CLIP model given" in said
    assert "step-1 0.3100, step-2 0.2200" in said


@pytest.mark.parametrize("family", ["sdxl", "flux1"])
def test_file_conversion_kohya_to_diffusers_and_back_loads_as_base_plus_adapter(models, family, tmp_path):
    """lorapod export FILE --to diffusers / --to comfyui, judged by diffusers and the ComfyUI model."""
    from lorapod.export.targets import export_run

    c, _m, parts, want = _lora(models, family, rslora=True)
    sizes = {n: m.out_features for n, m in c.denoiser.named_modules() if hasattr(m, "out_features")}
    save_file(kohya.to_kohya(parts, family, 8.0, True, dtype=torch.float32, out_features=sizes), str(tmp_path / "k.safetensors"))
    d = export_run(tmp_path / "k.safetensors", "diffusers", out=tmp_path / "d", base=str(models[family]), family=family)
    pipe, _c2, fresh = _fresh_modules(models, family)
    pipe.load_lora_weights(str(d.out), weight_name="pytorch_lora_weights.safetensors")
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    _assert_weights(fresh, want)
    # and back: the diffusers file (alpha in its metadata) to a kohya file ComfyUI loads whole
    k2 = export_run(d.out / "pytorch_lora_weights.safetensors", "comfyui", out=tmp_path / "k2",
                    base=str(models[family]), family=family)
    _p, c3, fresh3 = _fresh_modules(models, family)
    patches, dropped = comfy.load(load_file(str(k2.out / k2.files[0])), _comfy_map(family, c3))
    assert dropped == []
    comfy.apply(fresh3, patches)
    _assert_weights(fresh3, want)
    assert inspect_file(k2.out / k2.files[0])["family"] == family  # ss_base_model_version written


def test_image_eval_scores_with_a_local_clip_model(sd15_run, tmp_path):
    """The --clip path on a tiny random CLIP saved as a local folder (real code, meaningless scores)."""
    import shutil

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from lorapod.builtin.sd import clip_tokenizer
    from lorapod.evaluate.images import evaluate_images

    tok = clip_tokenizer(tmp_path / "tok")
    tok.model_max_length = 16
    text = {"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 16, "bos_token_id": len(tok) - 2,
            "eos_token_id": len(tok) - 1, "pad_token_id": len(tok) - 1}
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2}
    clip_dir = tmp_path / "clip"
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(str(clip_dir))
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer=tok).save_pretrained(str(clip_dir))
    run = tmp_path / "run"
    shutil.copytree(sd15_run, run)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red car --s 2 --d 3\n")
    res = evaluate_images(run, prompts, strengths=(1.0,), clip=clip_dir, device="cpu", log=lambda m: None)
    cells = res.grids[0].cells
    assert all(-1.0 <= c.clip_text <= 1.0 and -1.0 <= c.clip_train <= 1.0 for c in cells)
    assert cells[0].clip_base is None and all(c.clip_base is not None for c in cells[1:])
    assert "CLIP scores from" in (run / "eval" / "images.html").read_text()


@pytest.fixture(scope="module")
def wan_runs(tmp_path_factory):
    """Tiny Wan 2.1 and Wan 2.2 (two experts) runs trained by lorapod's engine: one 1-frame
    window, one epoch, so each ends with a checkpoint and the engine's ComfyUI file(s)."""
    pytest.importorskip("av")
    from lorapod.builtin.wan import build_wan
    from lorapod.demo_video import write_clips
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    from .image_fixtures import train_cpu

    root = tmp_path_factory.mktemp("wanexp")
    data = write_clips(root / "data", n=1, frames=8, sizes=[(48, 48)], images=0)
    runs = {}
    for family in ("wan21", "wan22"):
        model = build_wan(root / family, family)
        spec = load_spec(raw={
            "model": {"id": str(model), "family": family},
            "method": {"r": 4, "alpha": 8, "dropout": 0.0},
            "data": {"path": str(data), "format": "video", "resolution": 64, "trigger": "zxq",
                     "target_frames": [1], "fps": 16},
            "train": {"epochs": 1, "micro_batch_size": 1, "learning_rate": 5e-2, "seed": 0, "precision": "fp32"},
            "save": {"every_epochs": 1},
            "output": {"dir": str(root / "runs" / family), "name": "t"},
        })
        run = RunDir.create(spec.output.dir, "t")
        run.write_spec(spec)
        train_cpu(spec, run, root / family)
        runs[family] = (model, run)
    return runs


@pytest.mark.parametrize("family", ["wan21", "wan22"])
def test_wan_engine_file_is_the_export_file_and_comfyui_maps_every_key(wan_runs, family):
    """One key rule (engine/diffusion/families/wan.py WAN_RULES): the file the engine writes at the end of training
    equals `lorapod export --to comfyui`'s, one file per Wan 2.2 expert, and ComfyUI's Wan key map
    (tests/comfy_consumer.py) loads every key of each onto its expert's weights."""
    from diffusers import DiffusionPipeline

    from lorapod.export.targets import export_run

    model, run = wan_runs[family]
    names = ["t_high_noise.safetensors", "t_low_noise.safetensors"] if family == "wan22" else ["t.safetensors"]
    exported = export_run(run.root, "comfyui")
    assert sorted(exported.files) == sorted(names)
    pipe = DiffusionPipeline.from_pretrained(str(model))
    experts = [pipe.transformer, pipe.transformer_2] if family == "wan22" else [pipe.transformer]
    for name, transformer in zip(names, experts, strict=True):
        engine, export = load_file(str(run.adapter / name)), load_file(str(exported.out / name))
        assert engine.keys() == export.keys()
        assert all(torch.equal(engine[k], export[k]) for k in engine)
        patches, dropped = comfy.load(export, comfy.wan_keys(transformer))
        assert dropped == [] and len(patches) == len(export) // 3  # lora_down, lora_up, alpha per module
        assert {path for _, path in patches} >= {"blocks.0.attn1.to_q", "blocks.0.ffn.net.2"}


def test_partly_trained_fused_flux_module_exports_beside_the_adapter_on_its_device():
    """G4: a FLUX.1 single block with q, k, v trained but not ``proj_mlp`` fills the missing part of
    the fused ``linear1`` with zeros; they were made on the CPU and concatenated with the adapter's
    tensors, which live on the GPU during training (every checkpoint exports). ``meta`` tensors
    stand in for CUDA ones (the review's D3: "Tensor on device cpu is not on the expected device meta")."""
    h, r, mlp = 24, 4, 96
    parts = {"transformer": {f"single_transformer_blocks.0.attn.{m}.lora_{k}.weight":
                             torch.empty((r, h) if k == "A" else (h, r), device="meta")
                             for m in ("to_q", "to_k", "to_v") for k in ("A", "B")}}
    out = kohya.to_kohya(parts, "flux1", 8.0, False, out_features={"single_transformer_blocks.0.proj_mlp": mlp})
    down, up = out["lora_unet_single_blocks_0_linear1.lora_down.weight"], out["lora_unet_single_blocks_0_linear1.lora_up.weight"]
    assert down.device.type == up.device.type == "meta"
    assert down.shape == (4 * r, h) and up.shape == (3 * h + mlp, 4 * r)
