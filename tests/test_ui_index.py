"""What the dashboard lists, over HTTP (issue 38, item 4): a sweep whose jobs the ledger records by
a relative run_dir is one group, not two; the LLM demo's --out folder (a copy of its run's
spec.yaml and metrics.jsonl beside runs/) is not a run, and the run folders under it are."""

from __future__ import annotations

import json
import shutil

from starlette.testclient import TestClient

from lorapod.ui.app import Dashboard, build_app
from lorapod.ui.guard import cookie_name
from lorapod.ui.runs import RunIndex

from .ui_fixtures import run_folder

TOKEN = "t0ken-for-tests"


def _page(root, ledger_path=None) -> str:
    dash = Dashboard(RunIndex([root], ledger_path), TOKEN)
    c = TestClient(build_app(dash, {"testserver"}, 0), follow_redirects=False)
    c.cookies.set(cookie_name(0), TOKEN)
    r = c.get("/")
    assert r.status_code == 200, r.text
    return r.text


def _jobs(page: str) -> list[str]:
    return [line.split('data-job="')[1].split('"')[0] for line in page.splitlines() if 'class="run ' in line]


def test_a_sweep_the_ledger_records_by_relative_paths_is_listed_once(tmp_path, monkeypatch):
    from lorapod.store.ledger import Ledger

    monkeypatch.chdir(tmp_path)  # `lorapod sweep` ran here: its ledger rows say runs/NAME
    runs = tmp_path / "runs"
    ledger = Ledger(tmp_path / "ledger.db")
    jobs = ["sw-1-20261201-110000-0003", "sw-2-20261201-110000-0004"]
    for job in jobs:
        run_folder(runs, name=job)
        ledger.job_started(job, f"runs/{job}", "runpod", "runpod", None, 1.0, None)
        ledger.job_ended(job, "done", "finished")
    (runs / "sweep-sw-20261201-105959-0005").mkdir()
    (runs / "sweep-sw-20261201-105959-0005" / "sweep.json").write_text(json.dumps({
        "max_usd": 2.0, "usd": 0.5, "winner": jobs[0], "ranked": [{"job_id": j} for j in jobs]}))
    ledger.close()
    run_folder(runs, name="local-20261201-090000-0001")  # a `lorapod train` run beside them: scanned, absolute
    page = _page(tmp_path, tmp_path / "ledger.db")  # the scan sees /abs/runs, the ledger runs/
    assert page.count("<h3>sweep-sw-20261201-105959-0005") == 1
    assert sorted(_jobs(page)) == ["local-20261201-090000-0001", *jobs]  # each job once


def test_the_llm_demos_out_folder_is_not_a_run_and_its_runs_are_listed(tmp_path):
    out = tmp_path / "demo"  # what `lorapod demo --out demo` leaves: runs/<job>/ and copies at the top
    run = run_folder(out / "runs", name="demo-20261201-120000-ab12")
    shutil.copy2(run / "spec.yaml", out / "spec.yaml")
    shutil.copy2(run / "metrics.jsonl", out / "metrics.jsonl")
    (out / "adapter").mkdir()
    page = _page(tmp_path, tmp_path / "no-ledger.db")
    assert _jobs(page) == ["demo-20261201-120000-ab12"]
    # `lorapod ui` started inside the demo folder finds the same run
    assert _jobs(_page(out, tmp_path / "no-ledger.db")) == ["demo-20261201-120000-ab12"]
    # a plain run folder is still a run (its checkpoints/ and samples/ are never searched)
    solo = run_folder(tmp_path / "runs", name="solo-20261201-130000-cd34")
    assert (solo / "checkpoints").is_dir()
    assert sorted(_jobs(_page(tmp_path, tmp_path / "no-ledger.db"))) == ["demo-20261201-120000-ab12",
                                                                        "solo-20261201-130000-cd34"]
