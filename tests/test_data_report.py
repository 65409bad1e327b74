"""`lorapod data report`: a self-contained HTML page, rendered for real in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from lorapod.data.report import write_report

from .datasets_util import good_folder, photo, save


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    if os.environ.get("LORAPOD_REQUIRE_SYSTEM_TOOLS") == "1":
        pytest.fail("chromium is required (LORAPOD_REQUIRE_SYSTEM_TOOLS=1) but not installed")
    pytest.skip("chromium not installed: cannot render the HTML report")


def dataset(tmp_path):
    root = good_folder(tmp_path / "mug", n=6, size=(512, 384))
    shutil.copy(root / "img01.jpg", root / "dup.jpg")
    (root / "img02.txt").write_text("<script>alert('x')</script> & caption\n")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    save(photo((512, 384), seed=3).convert("RGBA"), root / "alpha.png")
    return root


def test_html_is_self_contained_and_escaped(tmp_path):
    root = dataset(tmp_path)
    out, report = write_report(root, tmp_path / "out" / "report.html", family="sd15", trigger="zxq_mug")
    page = out.read_text()
    # 8 readable cards + 2 pairs side by side: img01/dup (identical), img03/alpha (same picture, seed 3)
    assert report.summary["duplicates"]["exact"] == [["dup.jpg", "img01.jpg"]]
    assert [(d["a"], d["b"]) for d in report.summary["duplicates"]["near"]] == [("alpha.png", "img03.jpg")]
    assert page.count('src="data:image/jpeg;base64,') == 8 + 4
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from elsewhere
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert "broken.jpg" in page and "(cannot be displayed)" in page
    assert "Bucket plan" in page and "identical" in page  # duplicate pair shown side by side
    assert not list(root.glob("*.html"))  # the dataset folder is left alone
    assert report.summary["images"] == 9


def test_report_renders_in_headless_chromium(tmp_path):
    browser = chromium()
    root = dataset(tmp_path)
    out, _ = write_report(root, tmp_path / "report.html", family="sd15")
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--window-size=1200,1600", f"--screenshot={shot}", out.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert shot.exists(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        assert im.size == (1200, 1600)
        colours = im.convert("RGB").getcolors(maxcolors=1_000_000)
    # a blank page is one colour; thumbnails and text give thousands
    assert colours is None or len(colours) > 500


def test_default_output_is_never_inside_the_dataset(tmp_path, monkeypatch):
    root = good_folder(tmp_path / "mug", n=2, size=(128, 128))
    monkeypatch.chdir(root)
    out, _ = write_report(Path("."), family="sd15")
    assert out == tmp_path.resolve() / "mug-report.html" and out.exists()
