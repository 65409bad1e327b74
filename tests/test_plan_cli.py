"""``lorapod plan`` in-process (typer's CliRunner) and once as a real subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lorapod.cli.main as cli_main
from lorapod.cli.main import build_app

ROOT = Path(__file__).resolve().parents[1]
SDXL = str(ROOT / "examples" / "sdxl-object-lora.yaml")
LLM = str(ROOT / "examples" / "llm-chat-lora.yaml")  # README's LLM example: pins compute.gpu and compute.provider
KEYS = {"provider", "gpu", "tier", "usd_per_hour", "fits", "vram_peak_gb", "hours_total", "usd_total", "phases", "warnings",
        "hours_total_range", "usd_total_range", "vram_peak_gb_range", "speed", "spot"}


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    # Command groups other branches add may not be here yet; plan must work on its own.
    present = [c for c in cli_main.COMMANDS if importlib.util.find_spec(f"lorapod.cli.{c}")]
    monkeypatch.setattr(cli_main, "COMMANDS", present)


def _run(*args: str):
    return CliRunner().invoke(build_app(), list(args))


def test_plan_is_registered():
    assert "plan" in cli_main.COMMANDS


def test_json_follows_the_schema():
    r = _run("plan", SDXL, "--json", "--images", "25")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"options", "snapshot_date", "volume", "sort", "fastest_under_cap", "tier", "pinned",
                        "whole_market"}
    assert out["pinned"] == {} and out["whole_market"] is None
    assert out["snapshot_date"] == "2026-09-15"
    assert out["options"]
    for o in out["options"]:
        assert set(o) == KEYS
        assert all(set(p) == {"name", "hours", "usd"} for p in o["phases"])
        assert o["usd_total"] == pytest.approx(sum(p["usd"] for p in o["phases"]), abs=1e-3)
        lo, hi = o["hours_total_range"]
        assert lo < o["hours_total"] < hi
        slo, shi = o["speed"]["seconds_per_step_range"]
        assert slo < o["speed"]["seconds_per_step"] < shi
        assert o["speed"]["basis"] == "model"
        assert o["vram_peak_gb_range"][0] <= o["vram_peak_gb"] <= o["vram_peak_gb_range"][1]
    # ranked by $ + compute.hour_worth_usd ($1) x hours (plan/choose.py rank_key)
    worth = [o["usd_total"] + o["hours_total"] for o in out["options"]]
    assert worth == sorted(worth)


def test_table_names_phases_vram_and_snapshot():
    r = _run("plan", SDXL, "--gpu", "RTX 4090", "--provider", "runpod", "--images", "25")
    assert r.exit_code == 0, r.output
    for text in ("RTX 4090", "runpod", "train", "review + pull + destroy", "Peak VRAM", "2026-09-15", "2000 steps"):
        assert text in r.output


def test_set_overrides_reach_the_plan():
    r = _run("plan", SDXL, "--json", "--images", "25", "--gpu", "RTX 4090", "--provider", "vast",
             "--set", "compute.phases.boot_min=10", "--set", "compute.phases.prep_min=10",
             "--set", "compute.phases.train_min=30", "--set", "compute.phases.review_min=15")
    assert r.exit_code == 0, r.output
    (o,) = json.loads(r.stdout)["options"]
    assert o["hours_total"] == pytest.approx(65 / 60, abs=1e-3)
    assert round(o["usd_total"], 2) == 0.34


def test_storage_advice():
    r = _run("plan", "--storage", "--model-gb", "260", "--sessions-per-month", "8", "--hours-per-session", "3", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rates"] == {"container_disk_running_usd_per_month": 26.0, "volume_disk_stopped_usd_per_month": 52.0,
                            "network_volume_usd_per_month": 18.2}
    assert out["recommended"] in {"container disk", "volume disk", "network volume"}
    r = _run("plan", "--storage", "--model-gb", "260", "--sessions-per-month", "8", "--hours-per-session", "3")
    assert r.exit_code == 0 and "network volume" in r.output and "$52.00/month" in r.output


def test_errors_are_one_clean_line_with_a_hint():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "LORAPOD_HOME": os.environ["LORAPOD_HOME"]}
    env.pop("LORAPOD_DEBUG", None)
    code = (
        "import importlib.util, sys, lorapod.cli.main as m;"
        "m.COMMANDS=[c for c in m.COMMANDS if importlib.util.find_spec('lorapod.cli.'+c)];"
        "m.main(sys.argv[1:])"
    )
    r = subprocess.run([sys.executable, "-c", code, "plan", SDXL, "--gpu", "RTX 4099"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert "unknown GPU 'RTX 4099'" in r.stderr and "RTX 4090" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", code, "plan", "--storage", "--model-gb", "10"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and "--sessions-per-month" in r.stderr


def test_live_without_keys_uses_the_snapshot_and_says_so_first():
    r = _run("plan", SDXL, "--live", "--images", "25", "--gpu", "RTX 3090")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]  # not at the end of 45 lines (issue #38)
    assert first.startswith("--live: RUNPOD_API_KEY and VAST_API_KEY not set: offline prices snapshot of 20"), first
    assert "RUNPOD_API_KEY" not in "\n".join(r.output.splitlines()[1:])  # said once
    assert "* = live" not in r.output


def test_plan_does_not_import_torch():
    code = "import sys, lorapod.cli.plan, lorapod.plan.choose, lorapod.compute.live_prices; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def _words(text: str) -> str:
    return " ".join(text.split())  # the console wraps at 80 columns under CliRunner


def test_plan_says_what_pinned_the_table_and_offers_the_whole_market():
    r = _run("plan", LLM, "--examples", "1500")
    assert r.exit_code == 0, r.output
    said = _words(r.output)
    assert "only RTX 3090 on runpod: pinned by compute.gpu and compute.provider" in said
    assert f"the whole market: lorapod plan {LLM} --any-gpu --provider any (cheapest there: " in said
    out = json.loads(_run("plan", LLM, "--examples", "1500", "--json").stdout)
    assert out["pinned"] == {"compute.gpu": "RTX 3090", "compute.provider": "runpod"}
    assert {(o["gpu"], o["provider"]) for o in out["options"]} == {("RTX 3090", "runpod")}
    assert out["whole_market"]["usd_total"] < out["options"][0]["usd_total"]
    # the command it offers plans over the whole market, and says nothing was pinned
    wide = json.loads(_run("plan", LLM, "--examples", "1500", "--json", "--any-gpu", "--provider", "any").stdout)
    assert wide["pinned"] == {} and wide["whole_market"] is None
    assert len({o["gpu"] for o in wide["options"]}) > 3 and {o["provider"] for o in wide["options"]} == {"runpod", "vast"}
    assert wide["options"][0]["usd_total"] == out["whole_market"]["usd_total"]
    # --set compute.provider=any drops the spec's provider pin; --gpu is said as the flag it came from
    r = _run("plan", LLM, "--examples", "1500", "--set", "compute.provider=any", "--gpu", "RTX 4090")
    assert r.exit_code == 0, r.output
    assert "only RTX 4090: pinned by --gpu; the whole market: lorapod plan" in _words(r.output)
    assert "--provider any" not in _words(r.output).split("whole market:")[1].split("(")[0]
    r = _run("plan", LLM, "--any-gpu", "--gpu", "RTX 4090")
    assert r.exit_code == 1 and "contradict each other" in str(r.exception)


def test_a_gpu_that_does_not_fit_never_heads_the_table():
    # bf16 LoRA on an 8B model needs ~27 GB: the pinned 24 GB RTX 3090 does not fit
    r = _run("plan", LLM, "--examples", "1500", "--set", "method.type=lora")
    assert r.exit_code == 0, r.output
    said = _words(r.output)
    assert "#1" not in said and "no offer fits: RTX 3090 needs about" in said and "it fits with" in said
    rows = [line.split() for line in r.output.splitlines() if "does-not-fit" in line]
    assert rows and all(row[0] == "-" for row in rows)
    assert "Phases, does not fit: RTX 3090 on runpod" in said
    assert "the whole market: lorapod plan" in said and "(cheapest there: " in said
