"""The quality autopilot on the dashboard, in the real browser (Debian's Chromium through Playwright, as
tests/test_ui_browser.py drives it): the score per checkpoint drawn as a curve from metrics.jsonl, the
pick marked on it and named with its strength and reason, the early stop said, text from the run
folder shown as text."""

from __future__ import annotations

import pytest

from .test_ui_browser import Dashboard, browser, page, shots  # noqa: F401  (pytest fixtures by name)
from .ui_fixtures import run_folder, write_quality

pytestmark = pytest.mark.timeout(240)


def test_the_score_curve_marks_the_pick(page, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    root = run_folder(runs, steps=0, samples=0)  # the steps: write_quality's
    write_quality(root, {10: 0.05, 20: 0.12, 30: 0.20, 40: 0.205, 50: 0.198, 60: 0.201}, pick=30, stopped=60)
    ui = Dashboard(str(runs))
    try:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/{root.name}")
        page.wait_for_function("() => window.lorapod && window.lorapod.charts.quality && window.lorapod.charts.quality.u")
        u = "window.lorapod.charts.quality.u"
        labels = page.evaluate(f"{u}.series.map(s => s.label)")
        assert labels == ["step", "quality_score", "quality_fidelity", "pick"]
        xs, scores, pick = page.evaluate(f"[{u}.data[0], {u}.data[1], {u}.data[3]]")
        assert xs == [10, 20, 30, 40, 50, 60] and scores[2] == 0.2
        assert pick == [None, None, 0.2, None, None, None]  # one point: the pick, on the score curve
        assert page.locator("#quality-pick").inner_text() == "step-30 at strength 0.8"
        assert page.locator("table.quality tr.best td").first.inner_text() == "step-30"
        stopped = page.locator("#quality-stopped").inner_text()
        assert "stopped by train.stop_when at step 60" in stopped and "30.0 min" in stopped
        assert "<script>" in stopped  # the host's text, shown as text
        page.locator("#quality").screenshot(path=shots(tmp_path) / "run-quality.png")
    finally:
        ui.close()
