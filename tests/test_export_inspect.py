"""``lorapod inspect``: format, family, rank, alpha, and what ComfyUI / diffusers / llama.cpp keep or drop."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from lorapod.cli.main import build_app
from lorapod.errors import ExportError
from lorapod.export import gguf, kohya
from lorapod.export.inspect import inspect_file


def _pair(r=4, n_in=8, n_out=8):
    return {"lora_A.weight": torch.randn(r, n_in), "lora_B.weight": torch.randn(n_out, r)}


def _sd15_parts():
    unet = {f"down_blocks.0.attentions.0.transformer_blocks.0.attn1.{m}.{k}": v
            for m in ("to_q", "to_k") for k, v in _pair().items()}
    te = {f"encoder.layers.0.self_attn.{m}.{k}": v for m in ("q_proj", "v_proj") for k, v in _pair().items()}
    return {"unet": unet, "text_encoder": te}  # te named as transformers 5 names CLIPTextModel's modules


def test_own_kohya_file_loads_whole_in_comfyui_and_diffusers_at_the_trained_scale(tmp_path):
    f = tmp_path / "k.safetensors"
    save_file(kohya.to_kohya(_sd15_parts(), "sd15", 8.0, False), str(f), metadata={"ss_base_model_version": "sd_v1"})
    r = inspect_file(f)
    assert (r["format"], r["family"], r["rank"], r["alpha"], r["modules"]) == ("kohya", "sd15", [4], [8.0], 4)
    for name in ("ComfyUI", "diffusers"):
        assert r["consumers"][name] == {"loads": 4, "drops": [], "scale": [2.0]}
    assert r["flags"] == []


def test_foreign_keys_and_missing_alpha_are_flagged(tmp_path):
    t = kohya.to_kohya(_sd15_parts(), "sd15", 8.0, False)
    # what lorapod wrote before this fix under transformers 5, a stray module, and no alphas at all
    t = {k.replace("lora_te_text_model_", "lora_te_"): v for k, v in t.items() if not k.endswith(".alpha")}
    t["lora_unet_not_a_module.lora_down.weight"] = torch.zeros(4, 8)
    t["lora_unet_not_a_module.lora_up.weight"] = torch.zeros(8, 4)
    f = tmp_path / "foreign.safetensors"
    save_file(t, str(f))
    r = inspect_file(f)
    comfy = r["consumers"]["ComfyUI"]
    assert comfy["loads"] == 2 and comfy["scale"] == [1.0]
    assert sorted(d.split(":")[0] for d in comfy["drops"]) == [
        "lora_te_encoder_layers_0_self_attn_q_proj", "lora_te_encoder_layers_0_self_attn_v_proj",
        "lora_unet_not_a_module"]
    assert any("without text_model_" in d for d in comfy["drops"])
    assert r["alpha"] is None
    assert any(f.startswith("no .alpha keys") for f in r["flags"])
    assert "ComfyUI drops 3 module(s)" in r["flags"]


def test_diffusers_file_is_shown_as_not_for_comfyui(tmp_path):
    parts = _sd15_parts()
    tensors = {f"{c}.{k}": v for c, sd in parts.items() for k, v in sd.items()}
    meta = {"lora_adapter_metadata": json.dumps({"unet.lora_alpha": 8, "unet.r": 4})}
    f = tmp_path / "pytorch_lora_weights.safetensors"
    save_file(tensors, str(f), metadata=meta)
    r = inspect_file(f)
    assert r["format"] == "diffusers"
    assert r["consumers"]["diffusers"]["scale"] == [2.0]
    assert len(r["consumers"]["ComfyUI"]["drops"]) == 4  # attention keys (and v5 text-encoder paths)
    assert any("ComfyUI applies scale 1.0, not the trained 8.0/rank" in x for x in r["flags"])


def test_gguf_adapter_and_cli(tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, architectures=["LlamaForCausalLM"])
    state = {f"base_model.model.model.layers.{i}.self_attn.{m}.{k}": v for i in range(2) for m in ("q_proj", "v_proj")
             for k, v in _pair(4, 16, 16 if m == "q_proj" else 8).items()}
    path = gguf.write_adapter(state, cfg, 8.0, False, tmp_path / "a.gguf")
    r = inspect_file(path)
    assert r["family"] == "llm (llama)" and r["rank"] == [4] and r["alpha"] == [8.0]
    assert r["consumers"]["llama.cpp"] == {"loads": 4, "drops": [], "scale": [2.0]}
    assert r["targets"] == ["attn_q.weight", "attn_v.weight"]
    res = CliRunner().invoke(build_app(), ["inspect", str(path)])
    assert res.exit_code == 0, res.output
    assert re.search(r"llama\.cpp\s+loads 4 module\(s\) at scale \[2\.0\], drops 0", res.output)


def test_not_a_lora_and_truncated_files_name_the_file(tmp_path):
    f = tmp_path / "model.safetensors"
    save_file({"encoder.weight": torch.zeros(2, 2)}, str(f))
    with pytest.raises(ExportError, match=re.escape(f"{f} is not a LoRA file")):
        inspect_file(f)
    t = tmp_path / "t.safetensors"
    save_file(kohya.to_kohya(_sd15_parts(), "sd15", 8.0, False), str(t))
    t.write_bytes(t.read_bytes()[:300])
    with pytest.raises(ExportError, match=re.escape(f"{t} is not a readable safetensors file")):
        inspect_file(t)


@pytest.mark.parametrize("i2v", [False, True])
def test_wan_kohya_file_is_judged_by_comfyuis_wan_key_map_and_reproduces_the_lora(tmp_path, i2v):
    """The video engine's ComfyUI file: every key in ComfyUI's WanModel map (tests/comfy_consumer.py), the
    patched model gives the LoRA model's output, and ``inspect`` says ComfyUI loads every module."""
    import copy

    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    from lorapod.builtin.wan import tiny_wan_transformer
    from lorapod.engine.diffusion.families.wan import WAN_TARGETS

    from . import comfy_consumer as comfy

    base = tiny_wan_transformer(image_dim=16 if i2v else None)
    tuned = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=WAN_TARGETS), copy.deepcopy(base))
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in tuned.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    sd = get_peft_model_state_dict(tuned)
    f = tmp_path / "wan.safetensors"
    save_file(kohya.to_kohya({"transformer": sd}, "wan21", 8.0, False, dtype=torch.float32), str(f))
    patches, dropped = comfy.load(load_file(str(f)), comfy.wan_keys(base))
    assert dropped == [] and len(patches) == len(sd) // 2
    fresh = copy.deepcopy(base)
    comfy.apply({"transformer": fresh}, patches)
    torch.manual_seed(2)
    kw = {"hidden_states": torch.randn(1, base.config.in_channels, 1, 4, 4), "timestep": torch.tensor([500]),
          "encoder_hidden_states": torch.randn(1, 3, 32), "return_dict": False}
    if i2v:
        kw["encoder_hidden_states_image"] = torch.randn(1, 2, 16)
    with torch.no_grad():
        want, got, plain = tuned(**kw)[0], fresh(**kw)[0], base(**kw)[0]
    assert not torch.allclose(want, plain, atol=1e-3) and torch.allclose(got, want, atol=1e-5)
    r = inspect_file(f)
    assert r["family"] == "wan"
    assert r["consumers"]["ComfyUI"] == {"loads": len(patches), "drops": [], "scale": [2.0]}
    assert not any("drops" in x for x in r["flags"])
    t = load_file(str(f)) | {"lora_unet_blocks_0_self_attn_norm_q.lora_down.weight": torch.zeros(4, 24),
                             "lora_unet_blocks_0_self_attn_norm_q.lora_up.weight": torch.zeros(24, 4)}
    save_file(t, str(f))
    drops = inspect_file(f)["consumers"]["ComfyUI"]["drops"]
    assert drops == ["lora_unet_blocks_0_self_attn_norm_q: not a module of the model"]


def test_a_gguf_model_is_one_clear_error_not_a_report_with_rank_none(tmp_path, capsys):
    """What `lorapod inspect model.gguf` shows (issue #38): the first thing said is that it is not an
    adapter, once, with no `rank None` line before it."""
    import numpy as np

    from .cli_helpers import run_cli

    g = gguf._gguf()
    path = tmp_path / "model.gguf"
    w = g.GGUFWriter(str(path), "llama")
    w.add_type(g.GGUFType.MODEL)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code, out, err = run_cli(["inspect", str(path)], capsys)
    assert code == 1 and out == ""
    assert err.startswith(f"error: {path} is a GGUF model (llama, 1 tensors), not a LoRA adapter")
    assert "rank" not in err and "--to gguf" in err


def test_a_diffusers_wan_file_is_wan_and_comfyui_is_said_to_drop_its_names(tmp_path, capsys):
    """The video engine's pytorch_lora_weights.safetensors (diffusers' WanTransformer3DModel names) was
    called "flux1 or flux2"; Flux's diffusers names are transformer_blocks.N, Wan's blocks.N."""
    from .cli_helpers import run_cli

    t = {f"transformer.blocks.{i}.{m}.{k}": v for i in range(2)
         for m in ("attn1.to_q", "attn2.to_k", "ffn.net.0.proj") for k, v in _pair().items()}
    f = tmp_path / "pytorch_lora_weights.safetensors"
    save_file(t, str(f), metadata={"lora_adapter_metadata": json.dumps({"transformer.lora_alpha": 8,
                                                                        "transformer.r": 4})})
    r = inspect_file(f)
    assert (r["format"], r["family"]) == ("diffusers", "wan")
    assert r["consumers"]["diffusers"] == {"loads": 6, "drops": [], "scale": [2.0]}
    assert r["consumers"]["ComfyUI"]["loads"] == 0 and len(r["consumers"]["ComfyUI"]["drops"]) == 6
    assert all("diffusers Wan name" in d for d in r["consumers"]["ComfyUI"]["drops"])
    code, out, _err = run_cli(["inspect", str(f)], capsys)
    assert code == 0 and "family wan" in out and "flux" not in out
    flux = {f"transformer.transformer_blocks.0.attn.to_q.{k}": v for k, v in _pair().items()}
    save_file(flux, str(tmp_path / "flux.safetensors"))
    assert inspect_file(tmp_path / "flux.safetensors")["family"] == "flux1 or flux2"  # unchanged


def _peft_folder(tmp_path, alpha=32, r=4):
    folder = tmp_path / "adapter"
    folder.mkdir()
    t = {f"base_model.model.model.layers.0.self_attn.q_proj.{k}": v for k, v in _pair(r).items()}
    save_file(t, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, "peft_type": "LORA"}))
    return folder


def test_the_weights_file_of_a_peft_folder_reads_its_alpha_from_the_config_beside_it(tmp_path):
    """Issue 48, F19: `inspect adapter/adapter_model.safetensors` said "alpha unknown" with
    adapter_config.json right beside it."""
    folder = _peft_folder(tmp_path)
    r = inspect_file(folder / "adapter_model.safetensors")
    assert r["alpha"] == [32.0] and r["alpha_from"] == str(folder / "adapter_config.json")
    assert r["consumers"]["PEFT"]["scale"] == [8.0] and r["consumers"]["llama.cpp"]["scale"] == [8.0]
    out = CliRunner().invoke(build_app(), ["inspect", str(folder / "adapter_model.safetensors")]).output
    assert "alpha unknown" not in out and "32.0" in out


def test_a_bfloat16_alpha_is_read_without_torch(tmp_path):
    """sd-scripts saves a LoRA's alphas in its save dtype: bfloat16, which numpy cannot hold."""
    t = kohya.to_kohya(_sd15_parts(), "sd15", 8.0, False)
    t = {k: (v.to(torch.bfloat16) if k.endswith(".alpha") else v) for k, v in t.items()}
    f = tmp_path / "bf16.safetensors"
    save_file(t, str(f))
    r = inspect_file(f)
    assert r["alpha"] == [8.0] and r["consumers"]["ComfyUI"]["scale"] == [2.0]


def test_inspect_imports_neither_torch_nor_transformers_nor_diffusers(tmp_path):
    """Issue 48, F19: 6-14 s on a tiny file went to importing torch, transformers and diffusers,
    none of which reads a header. Checked by the modules a fresh interpreter ends with, not by a clock."""
    import subprocess
    import sys
    from pathlib import Path

    folder = _peft_folder(tmp_path)
    code = ("import sys\nfrom lorapod.cli.main import main\n"
            "try:\n    main(['inspect', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))")
    src = str(Path(__file__).resolve().parents[1] / "src")
    got = subprocess.run([sys.executable, "-c", code, str(folder / "adapter_model.safetensors")], capture_output=True,
                         text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": src})
    assert "alpha unknown" not in got.stdout and "LOADED []" in got.stdout, got.stdout + got.stderr
