"""`lorapod data fix`: fixes land in a copy (or in place with a backup); no original is ever lost."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from lorapod.data.fix import fix_dataset, normalise_caption
from lorapod.data.images import check_images
from lorapod.errors import DataError

from .datasets_util import good_folder, photo, save, tree_digest


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def messy(root):
    good_folder(root, n=15)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, displayed portrait
    save(photo((1280, 1024), seed=40), root / "rotated.jpg", exif=exif)
    (root / "rotated.TXT").write_text("  a mug, zxq_mug  \n")
    save(photo((1024, 1024), seed=41).convert("CMYK"), root / "cmyk.jpg")
    (root / "cmyk.caption").write_text("zxq_mug, cmyk\n")
    rgba = photo((1024, 1024), seed=42).convert("RGBA")
    rgba.putalpha(128)
    save(rgba, root / "alpha.png")
    (root / "alpha.txt").write_text("a mug\nwith two lines\n")
    (root / "latin1.jpg").write_bytes((root / "img00.jpg").read_bytes())
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    return root


def test_normalise_caption():
    assert normalise_caption("  a  mug \n on a table \n", None) == "a mug, on a table"
    assert normalise_caption("a mug, zxq, red", "zxq") == "zxq, a mug, red"
    assert normalise_caption("zxq, a mug", "zxq") == "zxq, a mug"
    assert normalise_caption("a photo of zxq on a table", "zxq") == "zxq, a photo of zxq on a table"
    assert normalise_caption("", "zxq") == "zxq"


def test_fix_into_new_folder_leaves_originals(tmp_path):
    src = messy(tmp_path / "mug")
    before = tree_digest(src)
    out = tmp_path / "mug-fixed"
    result = fix_dataset(src, out=out, trigger="zxq_mug")
    assert tree_digest(src) == before
    assert result.backup is None and result.target == out.resolve()
    with Image.open(out / "rotated.jpg") as im:
        assert im.size == (1024, 1280) and im.getexif().get(0x0112, 1) == 1
    with Image.open(out / "cmyk.jpg") as im:
        assert im.mode == "RGB"
    with Image.open(out / "alpha.png") as im:
        assert im.mode == "RGB"
    assert (out / "rotated.txt").read_text() == "zxq_mug, a mug\n"
    assert not (out / "rotated.TXT").exists()
    assert (out / "cmyk.txt").read_text() == "zxq_mug, cmyk\n"
    assert (out / "alpha.txt").read_text() == "zxq_mug, a mug, with two lines\n"
    assert (out / "latin1.txt").read_bytes() == b"caf\xe9\n"
    assert any("latin1.txt: left as is" in a for a in result.actions)
    # the fixed copy passes the checks these fixes address
    codes = {f.code for f in check_images(out, trigger="zxq_mug").findings}
    assert not codes & {"image-exif-rotated", "image-cmyk", "image-alpha", "caption-extension",
                        "trigger-missing", "trigger-not-first", "caption-multiline", "caption-whitespace"}


def test_fix_in_place_keeps_a_backup_of_every_changed_file(tmp_path):
    src = messy(tmp_path / "mug")
    before = tree_digest(src)
    originals = {rel: (src / rel).read_bytes() for rel in before}
    result = fix_dataset(src, in_place=True, trigger="zxq_mug")
    assert result.backup is not None and result.backup.parent == src.resolve().parent
    after = tree_digest(src)
    changed = {rel for rel in before if after.get(rel) != before[rel]}
    assert {"rotated.jpg", "cmyk.jpg", "alpha.png", "rotated.TXT", "alpha.txt"} <= changed
    for rel in changed:  # every original that changed or moved is in the backup, byte for byte
        assert (result.backup / rel).read_bytes() == originals[rel]
    unchanged = set(before) - changed
    assert "img00.jpg" in unchanged and not (result.backup / "img00.jpg").exists()


def test_fix_refuses_unsafe_targets(tmp_path):
    src = good_folder(tmp_path / "mug", n=2)
    with pytest.raises(DataError, match="--out NEW_FOLDER or --in-place"):
        fix_dataset(src)
    with pytest.raises(DataError, match="--out NEW_FOLDER or --in-place"):
        fix_dataset(src, out=tmp_path / "x", in_place=True)
    with pytest.raises(DataError, match="inside the dataset"):
        fix_dataset(src, out=src / "fixed")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        fix_dataset(src, out=tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_fix_never_writes_through_a_symlink(tmp_path):
    src = good_folder(tmp_path / "mug", n=2)
    outside = tmp_path / "outside"
    outside.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 3
    target = save(photo((512, 512), seed=9), outside / "ext.jpg", exif=exif)
    os.symlink(target, src / "ext.jpg")
    before = target.read_bytes()
    fix_dataset(src, in_place=True)
    assert target.read_bytes() == before
