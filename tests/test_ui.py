"""The dashboard's server without a browser: the token, the same-origin rule, the run-folder file
policy (no traversal, no links), escaping, downsampling and pagination (Starlette's TestClient)."""

from __future__ import annotations

import json
import os
import time

import pytest
from starlette.testclient import TestClient

from lorapod.ui.app import Dashboard, build_app
from lorapod.ui.files import Refused, serve
from lorapod.ui.guard import TOKEN_HEADER, cookie_name
from lorapod.ui.runs import RunIndex, downsample, sample_prompt, series
from lorapod.ui.views import PER_PAGE

from .ui_fixtures import HOSTILE, run_folder, write_metrics

TOKEN = "t0ken-for-tests"


def client(tmp_path, authed: bool = True) -> TestClient:
    dash = Dashboard(RunIndex([tmp_path]), TOKEN)
    c = TestClient(build_app(dash, {"testserver"}, 0), follow_redirects=False)
    if authed:
        c.cookies.set(cookie_name(0), TOKEN)
    return c


def test_no_token_is_403_and_the_printed_address_sets_a_cookie(tmp_path):
    run_folder(tmp_path)
    anon = client(tmp_path, authed=False)
    for path in ("/", "/runs/zxq-demo-20261201-120000-ab12", "/static/app.js", "/plan", "/data",
                 "/runs/zxq-demo-20261201-120000-ab12/file/samples/step000010-00.png"):
        assert anon.get(path).status_code == 403, path
    assert anon.get("/?token=wrong").status_code == 403
    r = anon.get("/?token=" + TOKEN)
    assert r.status_code == 303 and r.headers["location"] == "/"  # the token leaves the address bar
    assert "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
    assert anon.get("/").status_code == 200  # the cookie now carries it
    assert client(tmp_path).get("/", headers={"host": "evil.example:80"}).status_code == 403  # DNS rebinding


def test_changes_need_post_the_token_header_and_the_same_origin(tmp_path):
    run_folder(tmp_path)
    c = client(tmp_path)
    url = "/runs/zxq-demo-20261201-120000-ab12/stop"
    assert c.get(url).status_code == 405  # never a GET
    assert c.post(url).status_code == 403  # the cookie alone: a cross-site form could send that
    assert c.post(url, headers={TOKEN_HEADER: TOKEN, "origin": "http://evil.example"}).status_code == 403
    assert c.post(url, headers={TOKEN_HEADER: TOKEN}).status_code == 403  # no Origin at all
    r = c.post(url, headers={TOKEN_HEADER: TOKEN, "origin": "http://testserver"})
    assert r.status_code == 200 and r.json()["ok"], r.text
    assert (tmp_path / "zxq-demo-20261201-120000-ab12" / "STOP").is_file()  # a local run: the engine's STOP file


def test_files_only_inside_the_run_folder_and_never_through_a_link(tmp_path):
    root = run_folder(tmp_path)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\nsecret")
    (root / "samples" / "planted.png").symlink_to(secret)
    (root / "linked").symlink_to(tmp_path)
    (root / "samples" / "notes.html").write_text(HOSTILE)
    c = client(tmp_path)
    base = "/runs/" + root.name + "/file/"
    assert c.get(base + "samples/step000010-00.png").status_code == 200
    assert c.get(base + "samples/step000010-00.png").headers["content-type"] == "image/png"
    for bad in ("samples/planted.png", "linked/secret.png", "../secret.png", "samples/../../secret.png",
                "%2e%2e/secret.png", "samples/%2e%2e/%2e%2e/secret.png", "samples/notes.html", "spec.yaml",
                "/etc/passwd", "samples//step000010-00.png"):
        r = c.get(base + bad)  # (httpx folds a literal "../"; the %2e%2e forms reach the server as "..")
        assert 400 <= r.status_code < 500 and b"secret" not in r.content, bad
    for bad in ("../secret.png", "samples/../../secret.png", "linked/secret.png", "samples/planted.png"):
        with pytest.raises(Refused):
            serve(root, bad)
    page = c.get("/runs/" + root.name).text
    assert "planted.png" not in page  # a link is not even listed


def test_text_from_the_run_folder_is_escaped_and_scripts_are_only_ours(tmp_path):
    root = run_folder(tmp_path)
    (root / "eval").mkdir()
    (root / "eval" / "eval.json").write_text(json.dumps({
        "rows": [{"label": "base", "step": None, "val_loss": 2.0, "val_ppl": 7.4},
                 {"label": "step-10", "step": 10, "val_loss": 1.5, "val_ppl": 4.5}],
        "best": "step-10", "reason": "lowest validation loss " + HOSTILE,
        "answers": [{"prompt": "q " + HOSTILE, "base": "b", "tuned": "t"}]}))
    r = client(tmp_path).get("/runs/" + root.name)
    assert r.status_code == 200
    assert HOSTILE not in r.text and "&lt;script&gt;" in r.text
    assert r.text.count("<script") == 2  # uPlot and app.js, both from /static
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "Recommended checkpoint" in r.text and "step-10" in r.text


def test_metrics_are_downsampled_and_keep_spikes(tmp_path):
    xs = [float(i) for i in range(10_000)]
    ys = [1.0] * 10_000
    ys[4321] = 50.0
    dx, dy = downsample(xs, ys, 1500)
    assert len(dx) <= 1500 and dx[0] == 0 and dx[-1] == 9999 and 50.0 in dy and dx == sorted(dx)
    root = run_folder(tmp_path, steps=0)
    write_metrics(root, range(1, 10_001))
    t = time.perf_counter()
    m = client(tmp_path).get(f"/runs/{root.name}/metrics").json()
    assert time.perf_counter() - t < 5
    assert m["rows"] == 10_000 and len(m["series"]["loss"]["x"]) <= 1500 and m["series"]["loss"]["x"][-1] == 10_000
    assert m["offset"] == os.path.getsize(root / "metrics.jsonl")
    assert series([{"step": 1, "loss": float("nan")}]) == {}


def test_gallery_is_paginated(tmp_path):
    root = run_folder(tmp_path, samples=500)
    c = client(tmp_path)
    first = c.get(f"/runs/{root.name}").text
    assert first.count("<img loading") == PER_PAGE and "page 1 of 11" in first
    last = c.get(f"/runs/{root.name}?page=11").text
    assert last.count("<img loading") == 500 - 10 * PER_PAGE
    (root / "samples" / "step000900-00.mp4").write_bytes(b"\0\0\0\x18ftypisom")  # a video sample: a player
    newest = c.get(f"/runs/{root.name}").text
    assert f'<video controls preload="metadata" src="/runs/{root.name}/file/samples/step000900-00.mp4"' in newest
    assert c.get(f"/runs/{root.name}/file/samples/step000900-00.mp4").headers["content-type"] == "video/mp4"


def test_png_prompt_is_read_from_the_text_chunk_latin1_or_not(tmp_path):
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    root = run_folder(tmp_path)
    assert sample_prompt(root, "samples/step000010-01.png") == f"zxq {HOSTILE} mug #1"
    info = PngInfo()
    info.add_text("prompt", "zxq のマグカップ, 海辺")  # not Latin-1: Pillow writes an iTXt chunk
    Image.new("RGB", (8, 8)).save(root / "samples" / "step000020-00.png", pnginfo=info)
    assert sample_prompt(root, "samples/step000020-00.png") == "zxq のマグカップ, 海辺"
    (root / "samples" / "step000030-00.png").write_bytes(b"not a png")
    assert sample_prompt(root, "samples/step000030-00.png") is None


def test_runs_page_running_first_unconfirmed_destroy_in_red_and_sweeps_under_their_cap(tmp_path):
    from lorapod.store.ledger import Ledger

    runs = tmp_path / "runs"
    old = run_folder(runs, name="old-20261130-100000-0001")
    os.utime(old / "metrics.jsonl", (time.time() - 3600, time.time() - 3600))  # a local run, long over
    ledger = Ledger()
    for job in ("lost-20261201-110000-0002", "sw-1-20261201-110000-0003", "sw-2-20261201-110000-0004"):
        run_folder(runs, name=job)
        ledger.job_started(job, str(runs / job), "runpod", "runpod", None, 1.0, None)
    ledger.job_ended("lost-20261201-110000-0002", "stopped", "stopped by `lorapod down`")
    iid = ledger.instance_creating("runpod", "lost-20261201-110000-0002", 0.22, "RTX 3090")
    ledger.instance_created(iid, "pod-" + HOSTILE)
    ledger.instance_destroying(iid, "lorapod down")  # asked, never confirmed: it may still bill
    for job in ("sw-1-20261201-110000-0003", "sw-2-20261201-110000-0004"):
        ledger.job_update(job, state="running")
        ledger.instance_created(ledger.instance_creating("runpod", job, 0.5, "RTX 4090"), "pod-" + job[:4])
    (runs / "sweep-sw-20261201-105959-0005").mkdir()
    (runs / "sweep-sw-20261201-105959-0005" / "sweep.json").write_text(json.dumps({
        "max_usd": 2.0, "usd": 0.0, "winner": None,
        "ranked": [{"job_id": "sw-1-20261201-110000-0003"}, {"job_id": "sw-2-20261201-110000-0004"}]}))
    page = client(runs).get("/").text
    rows = [line for line in page.splitlines() if 'class="run ' in line]
    order = [r.split('data-job="')[1].split('"')[0] for r in rows]
    assert order[:2] == ["sw-2-20261201-110000-0004", "sw-1-20261201-110000-0003"]  # running first
    assert order[-1] == "old-20261130-100000-0001"
    lost = next(r for r in rows if "lost-" in r)
    assert "unconfirmed" in lost
    assert "destroy not confirmed for pod-&lt;script&gt;" in page and HOSTILE not in page
    assert 'href="https://www.runpod.io/console/pods"' in page  # the provider's own console
    assert "<h3>sweep-sw-20261201-105959-0005</h3>" in page and "$2.00" in page and "shared cap" in page
    rest = page.partition("shared cap")[2]
    assert "sw-1-" in rest.split("</tbody>")[0] and "lost-" not in rest.split("</tbody>")[0]


def test_cli_missing_extra_names_it_and_another_host_warns(tmp_path, monkeypatch, capsys):
    import subprocess
    import sys

    from .cli_helpers import run_cli
    from .remote_helpers import cli_argv, cli_env

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if lorapod[ui] were not installed
    code, _, err = run_cli(["ui", str(tmp_path)], capsys)
    assert code == 1 and "uvicorn" in err and "pip install 'lorapod[ui]'" in err and "Traceback" not in err
    monkeypatch.delitem(sys.modules, "uvicorn")
    code, _, err = run_cli(["ui", str(tmp_path / "nowhere")], capsys)
    assert code == 1 and "does not exist" in err
    # 127.0.0.2 is loopback on Linux, but not the default: the warning is what --host earns
    proc = subprocess.Popen([*cli_argv(), "ui", "--host", "127.0.0.2", "--port", "0", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        line = proc.stdout.readline()
        assert line.startswith("lorapod ui: http://127.0.0.2:") and "?token=" in line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "warning:" in err and "can destroy your instances" in err


def test_data_and_plan_pages_offer_the_users_own_specs_never_a_hosts(tmp_path):
    import yaml

    from lorapod.store.ledger import Ledger

    mine, planted = tmp_path / "mine" / "photos", tmp_path / "private"
    mine.mkdir(parents=True)
    planted.mkdir()
    spec = tmp_path / "mine" / "job.yaml"
    spec.write_text(yaml.safe_dump({"model": {"id": "x", "family": "sd15"}, "data": {"path": "photos"}}))
    root = run_folder(tmp_path / "runs", name="remote-20261201-110000-0006")
    # the pulled copy of the run folder: what the host sent back, naming another local folder
    (root / "spec.yaml").write_text(yaml.safe_dump({"model": {"id": "x"}, "data": {"path": str(planted)}}))
    Ledger().job_started(root.name, str(root), "runpod", "runpod", str(spec), None, None)
    page = client(tmp_path / "runs").get("/data").text
    assert str(mine) in page and str(planted) not in page
    plan = client(tmp_path / "runs").get("/plan").text
    assert str(spec) in plan and str(root / "spec.yaml") not in plan


def test_a_damaged_ledger_is_said_and_the_run_folders_still_show(tmp_path):
    from lorapod.home import lorapod_home

    run_folder(tmp_path)
    (lorapod_home() / "ledger.db").write_bytes(b"this is not a database" * 100)
    page = client(tmp_path).get("/")
    assert page.status_code == 200
    assert "cannot be read" in page.text and "may still bill" in page.text
    assert "zxq-demo-20261201-120000-ab12" in page.text


def test_destroy_confirmation_names_the_last_real_checkpoint(tmp_path):
    from lorapod.rundir import last_checkpoint

    root = run_folder(tmp_path)
    for n in (2, 30, 4):
        (root / "checkpoints" / f"step-{n}").mkdir()
    (root / "checkpoints" / "step-999").symlink_to(tmp_path)  # planted: not a checkpoint pulled here
    assert last_checkpoint(root) == "step-30"


def test_a_busy_port_is_a_clear_error():
    import socket

    from lorapod.errors import LorapodError
    from lorapod.ui.app import open_socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(LorapodError) as exc:
            open_socket("127.0.0.1", taken.getsockname()[1])
        assert "--port" in (exc.value.hint or "")
    finally:
        taken.close()
    free = open_socket("127.0.0.1", 0)
    assert free.getsockname()[0] == "127.0.0.1" and free.getsockname()[1] > 0
    free.close()


def test_a_spot_jobs_page_shows_its_preemptions_their_cost_and_the_savings(tmp_path):
    from lorapod.store.ledger import Ledger
    from lorapod.store.preemptions import record_preemption, record_spot_instance

    root = run_folder(tmp_path, name="spot-20261202-130000-0001")
    ledger = Ledger()
    ledger.job_started(root.name, str(root), "runpod", "runpod", None, 1.0, None)
    for preempted in (True, False):
        record_spot_instance(ledger, root.name, provider="runpod", gpu="RTX 4090", tier="spot", hours=1.0,
                             preempted=preempted, usd_per_hour=0.2, ondemand_usd_per_hour=0.5)
    record_preemption(ledger, root.name, instance_id="i-1", how="stopped", step=7, resume_step=6, usd_per_hour=0.2,
                      redo_hours=0.1, setup_hours=0.1, husk_hours=0.0, ondemand_usd_per_hour=0.5)
    page = client(tmp_path).get("/runs/" + root.name).text
    spot = page.split('<section id="spot">')[1].split("</section>")[0]
    # cost: 0.2 h x $0.20; saved: 2 h x ($0.50 - $0.20) less the 0.2 h wasted at $0.50
    assert "1 preemption(s), costing $0.0400" in " ".join(spot.split())
    assert "saved $0.5000 against on-demand" in " ".join(spot.split())
    plain = run_folder(tmp_path, name="plain-20261202-130000-0002")
    ledger.job_started(plain.name, str(plain), "runpod", "runpod", None, 1.0, None)
    assert '<section id="spot">' not in client(tmp_path).get("/runs/" + plain.name).text  # on-demand: nothing
