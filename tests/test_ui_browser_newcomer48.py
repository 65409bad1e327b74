"""Issue 48's Plan and Data page fixes (F7, F8) in a real browser: Playwright driving Debian's
Chromium against `lorapod ui` serving on loopback (the same set-up as tests/test_ui_browser.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("playwright")

from .test_ui_browser import Dashboard, browser, page  # noqa: F401  (the module's fixtures)
from .test_ui_newcomer48 import _mug

pytestmark = pytest.mark.timeout(240)
EX = Path(__file__).resolve().parents[1] / "examples"


def test_a_newcomer_plans_an_example_and_checks_a_folder_with_its_trigger(page, tmp_path):  # noqa: F811
    pytest.importorskip("PIL")
    from lorapod.data.check import check_path

    runs = tmp_path / "runs"
    runs.mkdir()
    folder = _mug(tmp_path)
    ui = Dashboard(str(runs), "--data", str(folder))
    try:
        page.goto(ui.url)
        page.goto(f"{ui.base}/plan")
        offered = page.locator("select[name=spec] option").all_inner_texts()
        sdxl = str((EX / "sdxl-object-lora.yaml").resolve())
        assert sdxl in offered and not any(o.endswith("demo.yaml") for o in offered)
        page.select_option("select[name=spec]", label=sdxl)
        page.click("text=Plan it")
        page.wait_for_selector("table.offers")
        assert "Phases, #1" in page.content() and page.locator("table.offers tr").count() > 2

        page.goto(f"{ui.base}/data")
        page.select_option("select[name=folder]", index=0)
        page.select_option("select[name=family]", "sdxl")
        page.fill("input[name=trigger]", "zxq_mug")
        page.click("text=Check it")
        page.wait_for_selector("iframe.report")
        assert "--family sdxl --trigger zxq_mug" in page.locator("p.dim code").first.inner_text()
        frame = page.frame_locator("iframe.report")
        summary = frame.locator("p", has_text="errors").first.inner_text()
        counts = check_path(folder, family="sdxl", trigger="zxq_mug").counts()
        got = re.search(r"(\d+) errors, (\d+) warnings", summary)
        assert got and (int(got[1]), int(got[2])) == (counts["error"], counts["warning"]), summary
        assert "p03.txt" in frame.locator("body").inner_text()  # the caption without the trigger
    finally:
        ui.close()
