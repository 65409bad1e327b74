"""Image-folder checks on real files built in code: every problem the issue lists becomes a finding."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from PIL import Image

from lorapod.data.captionfiles import approx_clip_tokens, clip_counter
from lorapod.data.check import check_path
from lorapod.data.imageinfo import hamming, inspect_image
from lorapod.data.images import check_images
from lorapod.errors import DataError, ModelLoadError

from .datasets_util import good_folder, photo, save, tree_digest


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def by_code(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


def test_clean_folder_has_no_errors_or_warnings(tmp_path):
    root = good_folder(tmp_path / "mug", n=16)
    report = check_images(root, family="sdxl", trigger="zxq_mug")
    assert [f for f in report.findings if f.severity != "info"] == []
    s = report.summary
    assert s["images"] == 16 and s["readable"] == 16 and s["captioned"] == 16
    assert s["buckets"] == [{"bucket": "1024x1024", "images": 16, "upscaled": 0}]
    assert s["caption_extension"] == ".txt"


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        check_images(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    report = check_images(tmp_path / "empty")
    assert report.has_errors and "no-images" in by_code(report)
    with pytest.raises(DataError, match="unknown image family"):
        check_images(tmp_path / "empty", family="sd3")


def test_check_path_refuses_a_single_image(tmp_path):
    p = save(photo((64, 64)), tmp_path / "one.jpg")
    with pytest.raises(DataError, match=r"neither a folder nor a \.jsonl"):
        check_path(p)


def test_image_problems(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    # small image (below SDXL minimum), upscaled by its bucket
    save(photo((800, 600), seed=50), root / "small.jpg", quality=90)
    (root / "small.txt").write_text("zxq_mug, small\n")
    # EXIF rotated
    exif = Image.Exif()
    exif[0x0112] = 6
    save(photo((1024, 1280), seed=51), root / "rotated.jpg", exif=exif)
    (root / "rotated.txt").write_text("zxq_mug, rotated\n")
    # CMYK, alpha in use, 16-bit
    save(photo((1024, 1024), seed=52).convert("CMYK"), root / "cmyk.jpg")
    rgba = photo((1024, 1024), seed=53).convert("RGBA")
    rgba.putalpha(Image.new("L", rgba.size, 0).point(lambda _: 0))
    save(rgba, root / "alpha.png")
    save(Image.new("I;16", (1024, 1024), 30000), root / "deep.png")
    # truncated JPEG, garbage with an image name, a PNG named .jpg, an empty file
    data = (root / "img00.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (root / "garbage.jpg").write_bytes(os.urandom(4096))
    save(photo((1024, 1024), seed=54), root / "ispng.jpg", format="PNG")
    (root / "empty.png").write_bytes(b"")
    # blurred, dark, bright
    save(photo((1024, 1024), seed=55, blur=12), root / "blurry.jpg")
    save(Image.new("RGB", (1024, 1024), (5, 5, 5)), root / "dark.png")
    save(Image.new("RGB", (1024, 1024), (252, 252, 252)), root / "bright.png")
    for name in ("cmyk", "alpha", "deep", "ispng", "blurry", "dark", "bright", "truncated", "garbage", "empty"):
        (root / f"{name}.txt").write_text(f"zxq_mug, {name}\n")

    report = check_images(root, family="sdxl")
    codes = by_code(report)
    paths = {code: sorted(f.path for f in fs) for code, fs in codes.items()}
    assert paths["image-too-small"] == ["small.jpg"]
    assert "small.jpg" not in paths.get("bucket-upscale", [])  # one finding per image
    assert paths["image-exif-rotated"] == ["rotated.jpg"]
    assert paths["image-cmyk"] == ["cmyk.jpg"]
    assert paths["image-alpha"] == ["alpha.png"]
    assert paths["image-16bit"] == ["deep.png"]
    assert paths["image-corrupt"] == ["truncated.jpg"]
    assert paths["image-not-an-image"] == ["garbage.jpg"]
    assert paths["image-extension-mismatch"] == ["ispng.jpg"]
    assert paths["image-empty"] == ["empty.png"]
    assert "blurry.jpg" in paths["image-blurry"] and "img00.jpg" not in paths["image-blurry"]
    assert "dark.png" in paths["image-underexposed"]
    assert paths["image-overexposed"] == ["bright.png"]
    assert report.has_errors


def test_duplicates_exact_and_near(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    shutil.copy(root / "img03.jpg", root / "copy.jpg")
    shutil.copy(root / "img03.txt", root / "copy.txt")
    near = Image.open(root / "img05.jpg").resize((1000, 1000))
    save(near, root / "near.jpg", quality=60)
    (root / "near.txt").write_text("zxq_mug, near\n")
    report = check_images(root)
    codes = by_code(report)
    assert len(codes["duplicate-exact"]) == 1
    assert "copy.jpg" in codes["duplicate-exact"][0].message and "img03.jpg" in codes["duplicate-exact"][0].message
    near_pairs = report.summary["duplicates"]["near"]
    assert [(d["a"], d["b"]) for d in near_pairs] == [("img05.jpg", "near.jpg")]
    assert 0 <= near_pairs[0]["distance"] <= 6
    assert "perceptual distance" in codes["duplicate-near"][0].message


def test_phash_separates_different_photos(tmp_path):
    a = inspect_image(save(photo((512, 512), seed=1), tmp_path / "a.jpg"), "a.jpg")
    b = inspect_image(save(photo((512, 512), seed=2), tmp_path / "b.jpg"), "b.jpg")
    a2 = inspect_image(save(photo((512, 512), seed=1).resize((400, 400)), tmp_path / "a2.png"), "a2.png")
    assert hamming(a.phash, a2.phash) <= 6
    assert hamming(a.phash, b.phash) > 16


def test_caption_pairing(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    (root / "img00.txt").rename(root / "img00.TXT")
    (root / "img01.txt").rename(root / "img01.caption")
    (root / "img02.txt").rename(root / "IMG02.txt")
    (root / "img03.txt").rename(root / "img03.jpg.txt")
    (root / "img04.txt").unlink()
    (root / "img99.txt").write_text("zxq_mug, misnumbered\n")
    report = check_images(root)
    paths = {code: sorted(f.path for f in fs) for code, fs in by_code(report).items()}
    assert paths["caption-extension"] == ["img00.TXT", "img01.caption", "img03.jpg.txt"]
    assert paths["caption-case-mismatch"] == ["IMG02.txt"]
    assert paths["caption-missing"] == ["img04.jpg"]
    assert paths["caption-orphan"] == ["img99.txt"]
    assert "caption-extension-inconsistent" in paths
    assert "caption-extension-not-txt" not in paths


def test_caption_extension_other_than_txt_is_noted(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    for p in root.glob("*.txt"):
        p.rename(p.with_suffix(".caption"))
    codes = by_code(check_images(root))
    assert "caption-missing" not in codes and "caption-extension" not in codes
    assert 'data.caption_extension: ".caption"' in codes["caption-extension-not-txt"][0].message


def test_no_captions_at_all_is_one_warning(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    for p in root.glob("*.txt"):
        p.unlink()
    codes = by_code(check_images(root))
    assert len(codes["no-captions"]) == 1 and "caption-missing" not in codes


def test_caption_contents(tmp_path):
    root = good_folder(tmp_path / "d", n=15, trigger="zxq_mug")
    (root / "img00.txt").write_text("   \n")
    (root / "img01.txt").write_bytes(b"zxq_mug, caf\xe9 mug\n")  # Latin-1, not UTF-8
    (root / "img02.txt").write_bytes(b"\x00\x01\x02\x89PNG garbage\xff")
    (root / "img03.txt").write_text("zxq_mug, a cup\non a table\n")
    (root / "img04.txt").write_text("a mug, zxq_mug, on a table\n")
    (root / "img05.txt").write_text("a mug on a table\n")
    (root / "img06.txt").write_text("zxq_mug, " + ", ".join(f"detail number {i}" for i in range(40)) + "\n")
    for i in (7, 8, 9):
        (root / f"img{i:02d}.txt").write_text("zxq_mug, a mug\n")
    (root / "img10.txt").write_text("  zxq_mug, padded  \n")
    report = check_images(root, family="sdxl", trigger="zxq_mug")
    paths = {code: sorted(f.path for f in fs) for code, fs in by_code(report).items()}
    assert paths["caption-empty"] == ["img00.txt"]
    assert paths["caption-not-utf8"] == ["img01.txt"]
    assert paths["caption-binary"] == ["img02.txt"]
    assert paths["caption-multiline"] == ["img03.txt"]
    assert paths["trigger-not-first"] == ["img04.txt"]
    assert paths["trigger-missing"] == ["img05.txt"]
    assert paths["caption-too-long"] == ["img06.txt"]
    assert paths["caption-repeated"] == ["img07.jpg"]
    assert paths["caption-whitespace"] == ["img10.txt"]


def test_caption_length_depends_on_family(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    (root / "img06.txt").write_text("zxq_mug, " + ", ".join(f"detail number {i}" for i in range(40)) + "\n")
    flux = by_code(check_images(root, family="flux1"))
    assert flux["caption-too-long"][0].severity == "info"
    assert "caption-too-long" not in by_code(check_images(root, family="wan21"))


def test_approx_clip_tokens_close_to_words():
    assert approx_clip_tokens("") == 2
    assert approx_clip_tokens("a red mug, on a table") == 2 + 6 + 1
    assert approx_clip_tokens("photo 2024") == 2 + 1 + 4


def test_clip_tokenizer_from_local_folder(tmp_path):
    import json

    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for w in ["a</w>", ",</w>", "r", "e", "d</w>", "re", "red</w>", "m", "u", "g</w>", "mu", "mug</w>"]:
        vocab[w] = len(vocab)
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\nr e\nre d</w>\nm u\nmu g</w>\n")
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    root = good_folder(tmp_path / "d", n=15)
    count, label = clip_counter(folder)
    assert label == f"tokenizer:{folder}"
    assert count("a red mug") == 5  # <|startoftext|> a red mug <|endoftext|>
    (root / "img00.txt").write_text("a red mug, " * 30 + "\n")  # 2 + 4 * 30 tokens
    report = check_images(root, tokenizer=folder)
    assert report.summary["token_count"] == f"tokenizer:{folder}"
    assert [f.path for f in report.findings if f.code == "caption-too-long"] == ["img00.txt"]
    with pytest.raises(ModelLoadError, match="CLIP tokenizer"):
        clip_counter(tmp_path / "d")


def test_dataset_toml_caption_extension(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    (root / "dataset.toml").write_text(
        '[general]\nresolution = 1024\n\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "."\n'
        'caption_extension = ".caption"\n'
    )
    codes = by_code(check_images(root))
    assert len(codes["toml-caption-extension"]) == 1
    assert "caption_extension = '.caption'" in codes["toml-caption-extension"][0].message
    # no caption_extension at all: sd-scripts falls back to .caption
    (root / "dataset.toml").write_text('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "."\n')
    assert "no caption_extension" in by_code(check_images(root))["toml-caption-extension"][0].message
    (root / "dataset.toml").write_text('[general]\ncaption_extension = ".txt"\n[[datasets]]\n[[datasets.subsets]]\n')
    assert "toml-caption-extension" not in by_code(check_images(root))
    (root / "dataset.toml").write_text("[[datasets]\nbroken")
    assert "toml-invalid" in by_code(check_images(root))


def test_count_guidance(tmp_path):
    few = by_code(check_images(good_folder(tmp_path / "few", n=5)))
    assert "count-low" in few
    many = by_code(check_images(good_folder(tmp_path / "many", n=41, size=(256, 256)), family="sd15"))
    assert "count-high" in many


def test_hostile_files_are_findings_and_check_changes_nothing(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    outside = save(photo((1024, 1024), seed=99), tmp_path / "outside.jpg")
    os.symlink(outside, root / "escape.jpg")
    os.symlink("loop.jpg", root / "loop.jpg")
    os.symlink(".", root / "dirloop")
    os.symlink(tmp_path / "missing.jpg", root / "broken.jpg")
    (root / "._img00.jpg").write_bytes(b"\x00\x05\x16\x07")
    (root / "notes.bmp").write_bytes(b"BM")
    big = root / "huge.jpg"
    with open(big, "wb") as fh:  # a 2 GB sparse file that starts like a JPEG: never read
        fh.write(b"\xff\xd8\xff\xe0")
        fh.truncate(2 * 1024**3)
    zeros = root / "zeros.jpg"
    with open(zeros, "wb") as fh:
        fh.truncate(2 * 1024**3)
    before = tree_digest(root)
    t0 = time.monotonic()
    report = check_images(root)
    assert time.monotonic() - t0 < 20
    assert tree_digest(root) == before
    paths = {code: sorted(f.path for f in fs) for code, fs in by_code(report).items()}
    assert paths["path-escapes"] == ["escape.jpg"]
    assert paths["symlink-loop"] == ["loop.jpg"]
    assert paths["symlink-broken"] == ["broken.jpg"]
    assert paths["symlink-folder"] == ["dirloop"]
    assert paths["image-too-large"] == ["huge.jpg"]
    assert paths["image-not-an-image"] == ["zeros.jpg"]
    assert paths["image-format"] == ["notes.bmp"]
    assert "hidden-files" in paths
    assert report.summary["images"] == 17  # the 15 + huge + zeros; links and hidden files are not images


def test_odd_file_names_and_pipes(tmp_path, capsys):
    import json

    root = good_folder(tmp_path / "d", n=15)
    raw = os.fsencode(root) + b"/caf\xe9.jpg"  # a Latin-1 file name: not valid UTF-8
    with open(raw, "wb") as fh:
        fh.write((root / "img00.jpg").read_bytes())
    os.mkfifo(root / "pipe.jpg")  # opening it would block forever
    report = check_images(root)
    text = json.dumps(report.to_dict(), ensure_ascii=False)
    text.encode("utf-8")  # printable: no lone surrogates
    paths = {code: sorted(f.path for f in fs) for code, fs in by_code(report).items()}
    assert paths["not-a-file"] == ["pipe.jpg"]
    assert paths["caption-missing"] == ["caf\ufffd.jpg"]


def test_flat_images_are_not_near_duplicates(tmp_path):
    root = good_folder(tmp_path / "d", n=15)
    save(Image.new("RGB", (1024, 1024), (20, 120, 200)), root / "blue.png")
    save(Image.new("RGB", (1024, 1024), (200, 40, 40)), root / "red.png")
    report = check_images(root)
    assert report.summary["duplicates"]["near"] == []
    assert {"blue.png", "red.png"} <= {f.path for f in report.findings if f.code == "image-blurry"}
