"""The dashboard with run folders a rented host wrote (issue 37): numbers it cannot show, names
with spaces, a metrics file of 100 MB or a line of 5 MB. Over HTTP through the ASGI app (Starlette's
TestClient): every page answers, and says what it knows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from lorapod.store.ledger import Ledger
from lorapod.ui.app import Dashboard, build_app
from lorapod.ui.guard import cookie_name
from lorapod.ui.runs import RunIndex

from .ui_fixtures import run_folder

TOKEN = "t0ken-for-tests"


def client(root: Path) -> TestClient:
    c = TestClient(build_app(Dashboard(RunIndex([root]), TOKEN), {"testserver"}, 0), follow_redirects=False)
    c.cookies.set(cookie_name(0), TOKEN)
    return c


def first_event(c: TestClient, url: str, kind: str) -> dict:
    """The first ``event: kind`` of a server-sent stream, read until it comes (then the stream is closed)."""
    with c.stream("GET", url) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:
            if line == f"event: {kind}":
                return json.loads(next(lines).removeprefix("data: "))
    raise AssertionError(f"no {kind} event")


def remote_job(runs: Path, name: str) -> Path:
    """A running RunPod job in the ledger whose run folder (pulled from the pod) is ``runs/name``."""
    root = run_folder(runs, name=name)
    ledger = Ledger()
    ledger.job_started(name, str(root), "runpod", "runpod", None, 5.0, None)
    ledger.job_update(name, state="running")
    ledger.instance_created(ledger.instance_creating("runpod", name, 0.44, "RTX 4090"), "pod-" + name[:6])
    ledger.close()
    return root


@pytest.mark.parametrize("step_time", [1e308, 1e14])
def test_a_hosts_far_future_eta_or_null_plan_hours_never_takes_a_page_down(tmp_path, step_time):
    """Before: `step_time_s` 1e308 (an infinite ETA) or 1e14 (year 3 million), or a plan.json with
    `hours_total: null`, made the Runs page, the run's page and the live table answer 500."""
    runs = tmp_path / "runs"
    root = remote_job(runs, "far-20261201-120000-0001")
    with open(root / "metrics.jsonl", "a") as fh:  # what the pod wrote: json.dumps writes inf as Infinity
        for step in range(21, 81):  # the last 50 steps' median is what the ETA uses
            fh.write(json.dumps({"time": time.time(), "step": step, "loss": 0.3, "step_time_s": step_time}) + "\n")
    (root / "plan.json").write_text(json.dumps({"job": {"steps": 10**6}, "options": [
        {"gpu": "RTX 4090", "provider": "runpod", "fits": True, "usd_total": 1.5, "hours_total": None}]}))
    c = client(runs)
    for url in ("/", "/runs/" + root.name):
        r = c.get(url)
        assert r.status_code == 200, (url, r.text[-2000:])
    page = c.get("/runs/" + root.name).text
    assert "Destroy now" in page and "80 / 1000000" in page  # the run and its button are there
    assert "at finish</span> -" in page and "planned</span> -" in page  # what it cannot know, as "-"
    table = first_event(c, "/stream/runs", "runs")["html"]
    assert root.name in table
    status = first_event(c, f"/runs/{root.name}/stream", "status")["html"]
    assert "80 / 1000000" in status


def test_a_run_folder_named_with_spaces_and_symbols_has_a_working_page(tmp_path):
    """Before: listed on the Runs page, but its link was 404 (and its files and stream too)."""
    runs = tmp_path / "runs"
    name = "my run (v2) #1 & co"
    root = run_folder(runs, name=name)
    c = client(runs)
    page = c.get("/").text
    href = page.split('data-job="my run')[1].split('href="')[1].split('"')[0]
    assert href == "/runs/my%20run%20%28v2%29%20%231%20%26%20co"
    run = c.get(href)
    assert run.status_code == 200 and "my run (v2) #1 &amp; co" in run.text
    img = run.text.split('<img loading="lazy" src="')[1].split('"')[0]
    assert c.get(img).status_code == 200 and c.get(img).headers["content-type"] == "image/png"
    assert c.get(href + "/metrics").json()["rows"] == 20
    assert "20 / 100" in first_event(c, href + "/stream", "status")["html"]
    assert (root / "spec.yaml").is_file()
    for bad in ("%2e%2e", "a%2Fb", "x" * 300):  # still only a run the index lists, by its exact name
        assert c.get("/runs/" + bad).status_code in (404, 405)


def _events(c: TestClient, url: str, most_quiet: int = 2):
    """(kind, data) of a stream's events until ``most_quiet`` status or ping events came in a row."""
    quiet = 0
    with c.stream("GET", url) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: ") and kind:
                yield kind, json.loads(line[len("data: "):])
                quiet = quiet + 1 if kind == "status" else 0
                kind = None
            elif line.startswith(": ping"):
                quiet += 1
            if quiet >= most_quiet:
                return


def test_a_metrics_line_over_4_mb_does_not_freeze_the_live_chart(tmp_path):
    """Before: the stream read 4 MB, found no line end and kept the same offset for good: no step
    after the long line ever reached the chart."""
    runs = tmp_path / "runs"
    root = run_folder(runs, name="long-20261201-120000-0001")
    offset = (root / "metrics.jsonl").stat().st_size
    with open(root / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 21, "loss": 0.3, "note": "x" * (5 * 1024 * 1024)}) + "\n")
        for step in range(22, 26):
            fh.write(json.dumps({"time": time.time(), "step": step, "loss": 0.2}) + "\n")
    steps: list[int] = []
    for kind, d in _events(client(runs), f"/runs/{root.name}/stream?offset={offset}"):
        steps += [r["step"] for r in d["rows"]] if kind == "metrics" else []
        if 25 in steps:
            break
    assert steps == [22, 23, 24, 25]


def test_a_100_mb_metrics_file_costs_a_bounded_read_and_the_note_never_calls_a_sample_the_total(tmp_path):
    """Before: every chart request read 64 MB and parsed every line (5-7 s, ~600 MB more memory;
    bench/ui_metrics.py), and the note called the lines it had read "N metrics lines"."""
    runs = tmp_path / "runs"
    root = run_folder(runs, name="huge-20261201-120000-0001", steps=0)
    line = json.dumps({"time": 1.0, "step": 7, "loss": 0.5, "lr": 1e-4, "step_time_s": 0.5, "tokens_per_s": 900.0})
    block = ((line + "\n") * 10_000).encode()
    with open(root / "metrics.jsonl", "wb") as fh:
        while fh.tell() < 100 * 1024 * 1024:
            fh.write(block)
        fh.write(json.dumps({"time": 2.0, "step": 123456, "loss": 0.25}).encode() + b"\n")
    size = (root / "metrics.jsonl").stat().st_size
    c = client(runs)
    t = time.perf_counter()
    got = c.get(f"/runs/{root.name}/metrics").json()
    took = time.perf_counter() - t
    assert got["sampled"] is True and got["bytes"] == size and got["offset"] == size
    assert got["rows"] < 60_000 and got["last_step"] == 123456  # read: about 3 MB of 100
    assert got["series"]["loss"]["x"][-1] == 123456
    assert took < 8.0, took  # 0.8 s on the shared 2-core build machine; 16-34 s before
    page = c.get(f"/runs/{root.name}").text
    assert 'id="chart-note"' in page
