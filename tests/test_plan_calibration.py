"""The planner's calibration (fitted terms and likely ranges) is kept on disk between plans, and a
change to what it was computed from is never answered from a stale copy."""

from __future__ import annotations

import json

import pytest

from lorapod.plan import fit as fitmod


@pytest.fixture
def fresh(monkeypatch):
    fitmod._calibration.cache_clear()
    yield
    fitmod._calibration.cache_clear()


def _cache_files(home):
    return sorted((home / "cache").glob("planner-calibration-*.json"))


def test_a_second_plan_reads_the_calibration_instead_of_fitting(fresh, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LORAPOD_HOME", str(home))
    first = fitmod.fitted()
    (path,) = _cache_files(home)
    fitmod._calibration.cache_clear()

    def no_fit(*a, **k):
        raise AssertionError("fitted again although nothing changed")

    monkeypatch.setattr(fitmod, "fit", no_fit)
    assert fitmod.fitted().theta == first.theta
    assert fitmod.spread("llm", "speed") == pytest.approx(tuple(json.loads(path.read_text())["spreads"]["llm/speed"]))
    assert "ampere" in fitmod.measured_archs()


def test_a_changed_input_or_a_broken_cache_is_recomputed(fresh, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LORAPOD_HOME", str(home))
    theta = fitmod.fitted().theta
    (old,) = _cache_files(home)
    # A broken cache file: recomputed, same result.
    old.write_text("{not json")
    fitmod._calibration.cache_clear()
    assert fitmod.fitted().theta == pytest.approx(theta)
    assert json.loads(old.read_text())["theta"] == pytest.approx(theta)
    # Another input (as after an upgrade that changed the data): another key, computed afresh.
    extra = tmp_path / "measurements-next.yaml"
    extra.write_text("# a newer dataset\n")
    monkeypatch.setattr(fitmod, "_CALIBRATION_INPUTS", (*fitmod._CALIBRATION_INPUTS, str(extra)))
    fitmod._calibration.cache_clear()
    fitmod.fitted()
    assert len(_cache_files(home)) == 2
