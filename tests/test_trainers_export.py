"""``lorapod export RUN --to comfyui`` of a run an external image trainer made.

The run folders are the real ones: the files each trainer's real run left in lorapod's run folder
(tests/recorded/<case>/files.json, from tools/upstream/real_run.py) with the LoRA files rebuilt from
their recorded key names and shapes (the recordings keep no weights), and the metadata each trainer
writes (``ss_base_model_version``: sd-scripts' ``sd_v1``, musubi-tuner's ``qwen_image`` / ``z_image``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lorapod.errors import ExportError
from lorapod.export.targets import export_run

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "recorded"
BASE_VERSION = {"sd15": "sd_v1", "qwenimage": "qwen_image", "zimage": "z_image"}
# the Z-Image LoRA as musubi-tuner saves it (the DiT's own to_q/to_k/to_v) and as its
# networks/convert_z_image_lora_to_comfy.py writes it for ComfyUI (attention.qkv, attention.out)
ZIMAGE_NATIVE = ["lora_unet_layers_0_attention_to_q", "lora_unet_layers_0_attention_to_k",
                 "lora_unet_layers_0_attention_to_v", "lora_unet_layers_0_attention_to_out_0",
                 "lora_unet_layers_0_feed_forward_w1"]
ZIMAGE_COMFY = ["lora_unet_layers_0_attention_qkv", "lora_unet_layers_0_attention_out",
                "lora_unet_layers_0_feed_forward_w1"]


def write_lora(path: Path, keys: dict[str, list[int]], base_version: str) -> Path:
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.full(shape, 0.01) for k, shape in keys.items()}, str(path),
              metadata={"ss_base_model_version": base_version})
    return path


def kohya_keys(modules: list[str], rank: int = 4, width: int = 8) -> dict[str, list[int]]:
    keys: dict[str, list[int]] = {}
    for m in modules:
        keys |= {f"{m}.lora_down.weight": [rank, width], f"{m}.lora_up.weight": [width, rank], f"{m}.alpha": []}
    return keys


def trainer_run(tmp: Path, case: str, family: str, trainer: str, keys: dict[str, list[int]],
                listing: list[str]) -> Path:
    """A run folder with the files ``listing`` names, the LoRA files carrying ``keys``."""
    run = tmp / "run"
    for rel in listing:
        path = run / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        elif rel.endswith(".safetensors") and "/state/" not in rel:
            write_lora(path, keys, BASE_VERSION[case])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    (run / "spec.yaml").write_text(yaml.safe_dump({
        "model": {"id": "org/model", "family": family}, "data": {"path": str(tmp), "format": "images"},
        "train": {"max_steps": 2}, "output": {"dir": str(tmp), "name": "real"}}))
    (run / "trainer.json").write_text(json.dumps({"trainer": trainer}) + "\n")
    return run


def recorded_run(tmp: Path, case: str, family: str, trainer: str) -> Path:
    rec = json.loads((RECORDED / case / "files.json").read_text())
    return trainer_run(tmp, case, family, trainer, rec["lora"]["keys"], rec["runs"]["two-steps"]["run"])


@pytest.mark.parametrize(("case", "family", "trainer"), [("qwenimage", "qwenimage", "musubi-tuner"),
                                                          ("sd15", "sd15", "sd-scripts")])
def test_a_trainers_lora_exports_for_comfyui_as_the_trainer_wrote_it(tmp_path, case, family, trainer):
    run = recorded_run(tmp_path, case, family, trainer)
    done = export_run(run, "comfyui")
    assert done.out == run / "exports" / "comfyui-final" and done.files == ["real.safetensors"]
    assert (done.out / "real.safetensors").read_bytes() == (run / "adapter" / "real.safetensors").read_bytes()
    assert "ComfyUI loads all" in done.notes[0]
    step = export_run(run, "comfyui", checkpoint=1)
    assert step.out.name == "comfyui-step-1" and step.files == ["real-step00000001.safetensors"]
    assert f"export comfyui of final ({trainer})" in (run / "events.log").read_text()


def test_the_other_targets_say_what_a_trainers_run_exports_to(tmp_path):
    run = recorded_run(tmp_path, "qwenimage", "qwenimage", "musubi-tuner")
    with pytest.raises(ExportError, match=r"trained by musubi-tuner.*exports --to comfyui") as info:
        export_run(run, "diffusers")
    assert "--to diffusers --family" in (info.value.hint or "")
    with pytest.raises(ExportError, match="has no step-7 from musubi-tuner") as info:
        export_run(run, "comfyui", checkpoint=7)
    assert "step-1, step-2" in (info.value.hint or "")
    assert not (run / "exports").exists()


def test_z_image_exports_musubis_converted_file_and_refuses_an_unconverted_checkpoint(tmp_path):
    """musubi-tuner converts only the final Z-Image LoRA for ComfyUI (the job's post step); its own
    layout beside it, and every checkpoint, names q/k/v apart, which ComfyUI's Lumina2 model does not."""
    listing = ["adapter/", "adapter/real.safetensors", "checkpoints/", "checkpoints/step-1/",
               "checkpoints/step-1/real-step00000001.safetensors", "metrics.jsonl", "spec.yaml", "trainer.json"]
    run = trainer_run(tmp_path, "zimage", "zimage", "musubi-tuner", kohya_keys(ZIMAGE_NATIVE), listing)
    write_lora(run / "adapter" / "real-comfyui.safetensors", kohya_keys(ZIMAGE_COMFY), "z_image")
    done = export_run(run, "comfyui")
    assert done.files == ["real-comfyui.safetensors"]
    with pytest.raises(ExportError, match=r"ComfyUI would not load real-step00000001\.safetensors whole") as info:
        export_run(run, "comfyui", checkpoint=1)
    assert "convert_z_image_lora_to_comfy.py" in (info.value.hint or "")


def test_an_unfinished_trainer_run_points_at_its_checkpoints(tmp_path):
    listing = ["adapter/", "checkpoints/", "checkpoints/step-1/", "checkpoints/step-1/real-step00000001.safetensors",
               "spec.yaml"]
    run = trainer_run(tmp_path, "qwenimage", "qwenimage", "musubi-tuner",
                      kohya_keys(["lora_unet_transformer_blocks_0_attn_to_q"]), listing)
    with pytest.raises(ExportError, match="has no final LoRA from musubi-tuner") as info:
        export_run(run, "comfyui")
    assert "step-1 (export one with --checkpoint N)" in (info.value.hint or "")
