"""musubi-tuner beyond Wan: Z-Image and Qwen-Image jobs (trainers/musubi.py ARCHS).

Each family's scripts, options and the files its loaders read are musubi-tuner's at the pinned
commit (docs/zimage.md, docs/qwen_image.md; every option is checked against the recorded parsers);
the real runs of both through `lorapod train --trainer musubi-tuner` are tests/test_trainers_real_runs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.spec import load_spec
from lorapod.trainers import get, prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.musubi import COMFYUI_SUFFIX

from .test_trainers_refuse import refused, spec_with

FAMILIES = {"zimage": ("Tongyi-MAI/Z-Image", "zimage_train_network.py", "networks.lora_zimage", "qwen_3_4b"),
            "qwenimage": ("Qwen/Qwen-Image", "qwen_image_train_network.py", "networks.lora_qwen_image",
                          "qwen_2.5_vl_7b")}


def job_for(tmp: Path, family: str, **sections):
    sections["model"] = {"id": FAMILIES[family][0], **sections.get("model", {})}
    path = spec_with(tmp, family, files=("a.png", "a.txt"), **sections)
    return prepare(load_spec(path), "musubi-tuner", Layout("/w"))[1]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_runs_its_own_scripts_with_its_text_encoder(tmp_path, family):
    _, script, network, encoder = FAMILIES[family]
    job = job_for(tmp_path, family)
    train = job.train_command()
    assert train.script == script and network in train.argv
    te = train.argv[train.argv.index("--text_encoder") + 1]
    assert Path(te).name == f"{encoder}.safetensors" and "--vae" in train.argv and "--task" not in train.argv
    caches = [c.script for c in job.commands if c.phase == "prepare" and c.script]
    prefix = script.removesuffix("_train_network.py")
    assert caches == [f"{prefix}_cache_latents.py", f"{prefix}_cache_text_encoder_outputs.py"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_fp8_base_is_scaled_as_their_docs_ask(tmp_path, family):
    argv = job_for(tmp_path, family, model={"dtype": "fp8"}).train_command().argv
    assert "--fp8_base" in argv and "--fp8_scaled" in argv


def test_wan_keeps_fp8_base_alone(tmp_path):
    path = spec_with(tmp_path, "wan21", model={"id": "Wan-AI/Wan2.1-T2V-1.3B", "dtype": "fp8"})
    argv = prepare(load_spec(path), "musubi-tuner", Layout("/w"))[1].train_command().argv
    assert "--fp8_base" in argv and "--fp8_scaled" not in argv


def test_z_image_ends_with_musubis_comfyui_conversion_and_resumes_the_training_command(tmp_path):
    job = job_for(tmp_path, "zimage")
    post = job.commands[-1]
    assert post.phase == "post" and post.argv[1].endswith("networks/convert_z_image_lora_to_comfy.py")
    assert post.argv[2:] == [f"{job.output_dir}/{job.output_name}.safetensors",
                             f"{job.output_dir}/{job.output_name}{COMFYUI_SUFFIX}.safetensors"]
    ckpt = tmp_path / "run" / "checkpoints" / "step-4"
    (ckpt / "state").mkdir(parents=True)
    get("musubi-tuner").resume(job, ckpt)
    assert "--resume" in job.train_command().argv and "--resume" not in post.argv
    # the same data: what the first launch cached is not encoded again
    assert [c.argv[-1] for c in job.commands if c.phase == "prepare" and c.script] == ["--skip_existing"] * 2


def test_the_converted_file_is_mirrored_as_a_final_lora(tmp_path):
    out = tmp_path / "trainer" / "out"
    out.mkdir(parents=True)
    for name in ("m.safetensors", f"m{COMFYUI_SUFFIX}.safetensors", "m-step00000002.safetensors"):
        (out / name).write_bytes(b"x")
    arts = get("musubi-tuner").artifacts(Layout(str(tmp_path)), "m")
    assert sorted((a.kind, a.key) for a in arts) == [("checkpoint", "step-2"), ("final", "m-comfyui.safetensors"),
                                                     ("final", "m.safetensors")]


def test_qwen_image_has_no_conversion(tmp_path):
    assert all(c.phase != "post" for c in job_for(tmp_path, "qwenimage").commands)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_clips_are_refused_for_an_image_family(tmp_path, family):
    msg = refused(spec_with(tmp_path, family, files=("a.png", "clip.mp4"), model={"id": FAMILIES[family][0]}),
                  "musubi-tuner")
    assert f"musubi-tuner trains {family} on images" in msg and "1 clip(s)" in msg


def test_qwen_image_2512_is_refused_not_guessed(tmp_path):
    msg = refused(spec_with(tmp_path, "qwenimage", model={"id": "Qwen/Qwen-Image-2512"}), "musubi-tuner")
    assert "Qwen-Image (the original) only" in msg


def test_z_image_turbo_downloads_the_turbo_dit(tmp_path):
    job = job_for(tmp_path, "zimage", model={"id": "Tongyi-MAI/Z-Image-Turbo"})
    downloads = [c.argv[-3:-1] for c in job.commands if c.name.startswith("download")]
    assert ["Comfy-Org/z_image_turbo", "split_files/diffusion_models/z_image_turbo_bf16.safetensors"] in downloads


def test_block_swap_is_capped_at_what_musubi_swaps(tmp_path):
    job = job_for(tmp_path, "zimage", train={"blocks_to_swap": 40})
    argv = job.train_command().argv
    assert argv[argv.index("--blocks_to_swap") + 1] == "28"
    assert any("swaps at most 28" in n for n in job.notes)


def _kohya_file(path: Path, modules: list[str], base_version: str) -> Path:
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for m in modules:
        tensors[f"{m}.lora_down.weight"] = torch.zeros(4, 8)
        tensors[f"{m}.lora_up.weight"] = torch.zeros(8, 4)
        tensors[f"{m}.alpha"] = torch.tensor(4.0)
    save_file(tensors, str(path), metadata={"ss_base_model_version": base_version})  # as musubi writes it
    return path


def test_inspect_tells_musubis_z_image_layout_from_the_one_comfyui_loads(tmp_path):
    """musubi-tuner's Z-Image LoRA names the DiT's own to_q/to_k/to_v; ComfyUI's Lumina2 model has
    attention.qkv, so only the converted file (networks/convert_z_image_lora_to_comfy.py) loads whole."""
    from lorapod.export.inspect import inspect_file

    native = ["lora_unet_layers_0_attention_to_q", "lora_unet_layers_0_attention_to_k",
              "lora_unet_layers_0_attention_to_v", "lora_unet_layers_0_attention_to_out_0",
              "lora_unet_layers_0_feed_forward_w1"]
    rep = inspect_file(_kohya_file(tmp_path / "native.safetensors", native, "z_image"))
    assert rep["family"] == "zimage" and rep["consumers"]["ComfyUI"]["loads"] == 1
    assert all("convert_z_image_lora_to_comfy.py" in d for d in rep["consumers"]["ComfyUI"]["drops"])
    converted = ["lora_unet_layers_0_attention_qkv", "lora_unet_layers_0_attention_out",
                 "lora_unet_layers_0_feed_forward_w1"]
    rep = inspect_file(_kohya_file(tmp_path / "comfy.safetensors", converted, "z_image"))
    assert rep["consumers"]["ComfyUI"] == {**rep["consumers"]["ComfyUI"], "loads": 3, "drops": []}


def test_inspect_loads_musubis_qwen_image_layout_in_comfyui(tmp_path):
    from lorapod.export.inspect import inspect_file

    mods = ["lora_unet_transformer_blocks_0_attn_to_q", "lora_unet_transformer_blocks_0_attn_add_k_proj",
            "lora_unet_transformer_blocks_0_img_mlp_net_0_proj", "lora_unet_transformer_blocks_0_txt_mlp_net_2"]
    rep = inspect_file(_kohya_file(tmp_path / "q.safetensors", mods, "qwen_image"))
    assert rep["family"] == "qwenimage"
    assert rep["consumers"]["ComfyUI"]["loads"] == 4 and rep["consumers"]["ComfyUI"]["drops"] == []
    rep = inspect_file(_kohya_file(tmp_path / "bad.safetensors", ["lora_unet_blocks_0_attn_qkv"], "qwen_image"))
    assert rep["consumers"]["ComfyUI"]["drops"] == ["lora_unet_blocks_0_attn_qkv: not a module of ComfyUI's model"]


def test_qwen_image_refuses_a_precision_its_trainer_cannot_run(tmp_path):
    """qwen_image_train_network.py keeps the DiT in bf16 and feeds it fp32 inputs: with
    --mixed_precision no the real run stopped at the first linear layer (mat1 and mat2 dtypes)."""
    msg = refused(spec_with(tmp_path, "qwenimage", model={"id": "Qwen/Qwen-Image"}, train={"precision": "fp32"}),
                  "musubi-tuner")
    assert "DiT in bf16 only" in msg and "train.precision bf16" in msg
    job = job_for(tmp_path, "zimage", train={"precision": "fp32"})  # Z-Image's trainer follows the precision
    assert job.train_command().argv[job.train_command().argv.index("--mixed_precision") + 1] == "no"
