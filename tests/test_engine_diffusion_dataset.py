"""Image data, buckets, prompts files and family detection: no model needed, all fast."""

from __future__ import annotations

import random

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from lorapod.engine.diffusion.dataset import bucket_table, fit_image, scan, transform_caption
from lorapod.engine.diffusion.families import detect, resolve_family
from lorapod.engine.diffusion.samples import load_prompts, parse_line
from lorapod.errors import DataError, ModelLoadError, SpecError


def _img(path, size=(64, 48), colour=(200, 10, 10)):
    Image.new("RGB", size, colour).save(path)


def test_bad_images_are_skipped_and_legacy_captions_decoded(tmp_path):
    d = tmp_path / "3_zxq"  # kohya folder convention: 3 repeats
    d.mkdir()
    _img(d / "a.png")
    (d / "a.txt").write_bytes("zxq, café au lait".encode("cp1252"))
    _img(d / "b.jpg", (48, 96))
    (d / "b.txt").write_bytes("\ufeffzxq, mug".encode())  # UTF-8 with BOM
    (d / "broken.png").write_bytes(b"\x89PNG not really")
    _img(d / "c.png")  # no caption: the trigger alone
    _img(d / "d.png")
    (d / "d.txt").write_text("zxq, first line\nzxq, second line\n", encoding="utf-8")
    items, findings = scan([d], 64, True, ".txt", 1, trigger="zxq")
    assert [i.path.name for i in items] == ["a.png", "b.jpg", "c.png", "d.png"]
    assert items[3].caption == "zxq, first line"  # trainers read the first line only
    assert items[0].caption == "zxq, café au lait" and items[1].caption == "zxq, mug" and items[2].caption == "zxq"
    assert all(i.repeats == 3 for i in items)
    codes = {(f.code, f.path.rsplit("/", 1)[-1]) for f in findings}
    assert codes == {("caption-encoding", "a.txt"), ("image-unreadable", "broken.png"), ("caption-missing", "c.png"),
                     ("caption-multiline", "d.txt")}
    assert items[1].bucket[0] < items[1].bucket[1]  # portrait stays portrait


def test_no_usable_image_is_a_data_error(tmp_path):
    (tmp_path / "x.png").write_bytes(b"nope")
    with pytest.raises(DataError, match="no usable image"):
        scan([tmp_path], 64, True, ".txt", 1)


def test_buckets_cover_the_area_without_square_crops():
    table = bucket_table(1024)
    assert (1024, 1024) in {(b.width, b.height) for b in table}
    f = fit_image((3000, 2000), table)
    b = f.bucket
    assert b[0] % 64 == 0 and b[1] % 64 == 0 and b[0] * b[1] <= 1024 * 1024
    assert abs(b[0] / b[1] - 1.5) < 0.1 and b[0] * b[1] > 0.9 * 1024 * 1024
    assert f.resized[0] >= b[0] and f.resized[1] >= b[1]
    assert f.crop == ((f.resized[0] - b[0]) // 2, (f.resized[1] - b[1]) // 2)
    assert {(b.width, b.height) for b in bucket_table(64)} >= {(64, 64), (80, 48), (48, 80)}


def test_caption_shuffle_keeps_the_trigger_first_and_dropout_empties():
    rng = random.Random(0)
    seen = {transform_caption("zxq, a, b, c, d", rng, True, 0.0) for _ in range(30)}
    assert len(seen) > 3 and all(s.startswith("zxq, ") for s in seen)
    assert transform_caption("zxq, a", random.Random(0), False, 1.0) == ""


def test_sd_scripts_prompt_lines(tmp_path):
    sp = parse_line("zxq mug on a beach, sunset --w 1024 --h 768 --d 42 --s 28 --l 6.5 --n blurry, low quality",
                    512, 512, 1, 20, 7.0)
    assert (sp.prompt, sp.width, sp.height, sp.seed, sp.steps, sp.scale, sp.negative) == (
        "zxq mug on a beach, sunset", 1024, 768, 42, 28, 6.5, "blurry, low quality")
    f = tmp_path / "prompts.txt"
    f.write_text("# comment\nzxq mug\n\nzxq cat --d 5\n", encoding="utf-8")
    got = load_prompts(str(f), 512, 512, 1, 20, 7.0)
    assert [(p.prompt, p.seed, p.width) for p in got] == [("zxq mug", 1, 512), ("zxq cat", 5, 512)]
    with pytest.raises(SpecError, match="does not exist"):
        load_prompts(str(tmp_path / "missing.txt"), 512, 512, 1, 20, 7.0)
    assert load_prompts("zxq mug --d 3", 512, 512, 1, 20, 7.0)[0].seed == 3  # a single inline prompt
    with pytest.raises(SpecError, match="--q"):
        parse_line("x --q 3", 512, 512, 1, 20, 7.0)


def test_single_file_family_is_read_from_tensor_names(tmp_path):
    f = tmp_path / "sd_xl_base_1.0.safetensors"
    save_file({"conditioner.embedders.1.model.ln_final.weight": torch.zeros(1),
               "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(1)}, str(f))
    assert detect(str(f))[0] == "sdxl"
    with pytest.raises(ModelLoadError, match=r"family sdxl"):
        resolve_family("sd15", str(f))
    g = tmp_path / "flux1-dev.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(1)}, str(g))
    assert resolve_family("auto", str(g)).name == "flux1"


def test_a_folder_without_model_index_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"model_index\.json"):
        detect(str(tmp_path))


@pytest.mark.parametrize("name,family", [("sdxl-object-lora.yaml", "sdxl"), ("flux2-klein-lora.yaml", "flux2")])
def test_example_image_specs_are_ones_the_engine_trains(name, family):
    from pathlib import Path

    from lorapod.engine.diffusion.families import FAMILIES
    from lorapod.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / name)
    assert spec.is_image and spec.model.family == family and family in FAMILIES
    assert not (spec.method.train_text_encoder and spec.data.cache_text_encoder_outputs)
    prompts = load_prompts(spec.samples.prompts, 1024, 1024, 0, 28, 4.0)
    assert len(prompts) == 2 and all(p.prompt.startswith(spec.data.trigger) for p in prompts)


def test_an_unreachable_hub_id_is_a_model_load_error_with_a_hint():
    # conftest sets HF_HUB_OFFLINE=1: nothing is fetched, the error says what to check
    with pytest.raises(ModelLoadError, match=r"model_index\.json of someone/not-cached") as exc:
        resolve_family("sdxl", "someone/not-cached")
    assert "huggingface-cli login" in str(exc.value)
