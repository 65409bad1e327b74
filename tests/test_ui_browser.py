"""`lorapod ui` in a real browser: Playwright driving Debian's Chromium (never Playwright's own
download, which cannot work offline) against the real CLI serving on loopback.

One browser for the module. A local run folder appending metrics shows them on the chart within
5 s; remote runs on the RunPod fake control plane (tests/fakes, its OpenAPI document, a real sshd
per "pod") are followed, stopped at their save and destroyed from the page, and the ledger and the
Runs page agree afterwards. Screenshots of every page are taken on the way: into
``$LORAPOD_UI_SHOTS`` when set (``LORAPOD_UI_SHOTS=docs/ui`` refreshes the ones docs/ui.md shows),
else into the test's tmp folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright import sync_api as playwright

from lorapod.store.ledger import Ledger

from .fakes.runpod_fake import RunPodFake
from .remote_helpers import cli_argv, cli_env, fake_command_template, make_spec
from .test_data_report import chromium
from .ui_fixtures import run_folder, write_metrics

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert errors == [], errors  # no script error on any page


def shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("LORAPOD_UI_SHOTS") or tmp_path / "shots")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Dashboard:
    """`lorapod ui --port 0 ...` as a subprocess; ``url`` is the address it printed."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([*cli_argv(), "ui", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=cli_env(**(env or {})))
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"(http://127\.0\.0\.1:(\d+))(/[A-Za-z0-9_-]{16})?/\?token=(\S+)", line)
        if not m:
            self.close()
            raise AssertionError(f"no address printed: {line!r} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        # origin: http://127.0.0.1:PORT; base: with the dashboard's random prefix (ui/guard.py)
        self.origin, self.port, self.prefix, self.token = m.group(1), int(m.group(2)), m.group(3) or "", m.group(4)
        self.base = self.origin + self.prefix
        self.url = f"{self.base}/?token={self.token}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_for(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def listening_sockets(pid: int) -> list[str]:
    """Local addresses of the TCP sockets ``pid`` listens on (from /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A = LISTEN
                out.append(f[1])
    return out


# ----------------------------------------------------------------------------- a run on this machine


@pytest.mark.slow
def test_local_run_live_chart_pages_and_safety(page, tmp_path):
    runs = tmp_path / "runs"
    root = run_folder(runs, steps=20, samples=6, image_eval=True)
    other = run_folder(runs, name="zxq-lr2e-4-20261130-090000-cd34", steps=30, samples=0, scale=1.3)
    os.utime(other / "metrics.jsonl", (time.time() - 3600, time.time() - 3600))  # ended an hour ago
    (root / "samples" / "planted.png").symlink_to(tmp_path / "outside.png")
    (tmp_path / "outside.png").write_bytes((root / "samples" / "step000010-00.png").read_bytes())
    (runs / "data").mkdir()
    ui = Dashboard(str(runs), "--spec", str(Path(__file__).parents[1] / "examples" / "sdxl-object-lora.yaml"),
                   "--data", str(runs / "data"))
    out = shots(tmp_path)
    try:
        # Loopback only: the one listening socket is 127.0.0.1 (0100007F in /proc/net/tcp).
        assert listening_sockets(ui.proc.pid) == [f"0100007F:{ui.port:04X}"]
        # No token: 403, for pages, files and the stream alike.
        for path in ("/", f"/runs/{root.name}", f"/runs/{root.name}/stream", "/static/app.js"):
            assert page.goto(ui.base + path).status == 403, path
            assert page.goto(ui.origin + path).status == 403, path
        page.goto(ui.url)
        assert page.url == ui.base + "/"  # the token left the address bar for a cookie
        assert page.locator("tr.run").count() == 2
        assert page.locator("tr.run td.state").all_inner_texts() == ["running", "ended"]  # running first
        page.check(f"input[value='{root.name}']")
        page.check(f"input[value='{other.name}']")
        time.sleep(2.5)  # a refresh of the table (every 2 s while a run runs) keeps what was ticked
        page.click("text=Compare the ticked runs")
        page.wait_for_function("() => window.lorapod && window.lorapod.charts['compare-loss'] !== undefined")
        assert page.evaluate("window.lorapod.charts['compare-loss'].u.series.map(s => s.label)") == \
            ["step", root.name, other.name]
        page.screenshot(path=out / "compare.png", full_page=True)

        page.goto(f"{ui.base}/runs/{root.name}")
        page.wait_for_function("() => window.lorapod && window.lorapod.lastStep === 20")
        # The stream is open and has read the file once (its first status event follows that read).
        page.wait_for_function("() => window.lorapod.statusEvents > 0")
        write_metrics(root, range(21, 26))
        seen = wait_for(lambda: page.evaluate("window.lorapod.lastStep") == 25, 5.0, "step 25 on the chart")
        chart_x = page.evaluate("window.lorapod.charts.loss.u.data[0]")
        assert chart_x[-1] == 25 and len(chart_x) == 25, chart_x
        print(f"new metrics lines on the chart after {seen:.2f} s")
        # A traversal path and a planted link are refused from the browser too.
        # (a browser folds "../" and "%2e%2e/" itself; "%2f" reaches the server as "/", so ".." arrives)
        assert page.evaluate(f"fetch('{ui.prefix}/runs/{root.name}/file/samples%2f..%2f..%2f..%2foutside.png')"
                             ".then(r => r.status)") == 404
        assert page.evaluate(f"fetch('{ui.prefix}/runs/{root.name}/file/samples/planted.png').then(r => r.status)") \
            == 404
        assert page.locator("img[src$='planted.png']").count() == 0
        assert page.locator(".gallery img").count() == 6
        assert page.locator("figure.grid img").count() == 1  # the eval grid
        assert page.locator(".prompt").first.inner_text().startswith("zxq <script>")  # shown as text
        page.screenshot(path=out / "run-local.png", full_page=True)

        # Stop at the next save, for a run on this machine: the engine's STOP file.
        page.once("dialog", lambda d: (_check_dialog(d, "saves a checkpoint"), d.accept()))
        page.click("text=Stop at the next save")
        page.wait_for_selector("#action-out[data-ok='true']")
        assert (root / "STOP").is_file()

        page.goto(f"{ui.base}/plan?spec=0")
        assert "Offers ranked by $ per job" in page.content() and page.locator("table.offers tr").count() > 2
        page.screenshot(path=out / "plan.png", full_page=True)
        page.goto(f"{ui.base}/data?folder=0")
        page.wait_for_selector("iframe.report")
        frame = page.frame_locator("iframe.report")
        assert "Dataset report" in frame.locator("h1").inner_text()
        page.screenshot(path=out / "data.png", full_page=True)
    finally:
        ui.close()


def test_runs_overview_sweep_under_its_cap_and_an_unconfirmed_destroy_in_red(page, tmp_path):
    runs = tmp_path / "runs"
    ledger = Ledger()
    sweep = ["zxq-sweep-1-20261201-110000-0003", "zxq-sweep-2-20261201-110000-0004"]
    for i, job in enumerate(sweep):
        root = run_folder(runs, name=job, steps=40 + 20 * i, total=120, scale=1.0 + 0.3 * i)
        (root / "plan.json").write_text(json.dumps({"options": [{"provider": "vast", "gpu": "RTX 4090", "fits": True,
                                                                 "usd_total": 0.62, "hours_total": 1.5}]}))
        ledger.job_started(job, str(root), "vast", "vast", None, 1.0, None)
        ledger.job_update(job, state="running", last_step=40 + 20 * i)
        ledger.instance_created(ledger.instance_creating("vast", job, 0.31, "RTX 4090"), f"2890{i}")
    (runs / "sweep-zxq-sweep-20261201-105959-0005").mkdir()
    (runs / "sweep-zxq-sweep-20261201-105959-0005" / "sweep.json").write_text(json.dumps(
        {"max_usd": 2.0, "usd": 0.0, "winner": None, "ranked": [{"job_id": j} for j in sweep]}))
    lost = "sdxl-mug-20261201-093000-0002"
    run_folder(runs, name=lost, steps=60, total=60)
    ledger.job_started(lost, str(runs / lost), "runpod", "runpod", None, 2.0, None)
    ledger.job_ended(lost, "stopped", "stopped by `lorapod down` at step 60")
    iid = ledger.instance_creating("runpod", lost, 0.74, "RTX 4090")
    ledger.instance_created(iid, "u4x9qk2m1c0z7e")
    ledger.instance_destroying(iid, "lorapod down")  # asked, never confirmed: it may still bill
    done = run_folder(runs, name="zxq-demo-20261130-180000-ab12", steps=64, total=64)
    (done / "adapter").mkdir()
    ui = Dashboard(str(runs))
    try:
        page.goto(ui.url)
        assert page.locator("tr.run td.state").all_inner_texts() == ["running", "running", "stopped", "done"]
        red = page.locator("tr.unconfirmed.warn")
        assert "u4x9qk2m1c0z7e" in red.inner_text() and "may still bill" in red.inner_text()
        assert red.locator("a").get_attribute("href") == "https://www.runpod.io/console/pods"
        assert page.locator("tr.run.unconfirmed td").first.evaluate("e => getComputedStyle(e).color") == \
            "rgb(198, 40, 40)"  # red, as `lorapod ps` prints it
        cap = page.locator(".sweep").first.inner_text()
        assert "shared cap" in cap and "$2.00" in cap
        page.screenshot(path=shots(tmp_path) / "runs.png", full_page=True)
    finally:
        ui.close()


def _check_dialog(dialog, words: str) -> None:
    assert words in dialog.message, dialog.message


def test_a_long_metrics_line_does_not_freeze_the_chart_and_a_sampled_file_is_said(page, tmp_path):
    """A host writes metrics.jsonl. Before: a line over 4 MB stopped the live chart for good, and
    the note called the lines read of a large file its total. Now the chart moves past the line,
    and the note of a 3 MB file (more than the 2 MB read in full) says it was sampled, to which step."""
    runs = tmp_path / "runs"
    root = run_folder(runs, steps=0)
    with open(root / "metrics.jsonl", "w") as fh:
        step = 0
        while fh.tell() < 3 * 1024 * 1024:
            step += 1
            fh.write(json.dumps({"time": time.time(), "step": step, "loss": 1.0 / step, "lr": 1e-4,
                                 "step_time_s": 0.5, "pad": "x" * 100}) + "\n")
    ui = Dashboard(str(runs))
    try:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/{root.name}")
        page.wait_for_function(f"() => window.lorapod && window.lorapod.lastStep === {step}")
        page.wait_for_function("() => window.lorapod.statusEvents > 0")  # the stream follows the file
        with open(root / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": step + 1, "loss": 0.5, "junk": "y" * (5 * 1024 * 1024)}) + "\n")
            for k in range(2, 6):
                fh.write(json.dumps({"time": time.time(), "step": step + k, "loss": 0.1}) + "\n")
        wait_for(lambda: page.evaluate("window.lorapod.lastStep") == step + 5, 10.0, "the steps after the long line")
        page.reload()
        page.wait_for_function(f"() => window.lorapod && window.lorapod.lastStep === {step + 5}")
        note = page.inner_text("#chart-note")
        assert "sampled" in note and f"up to step {step + 5}" in note and "8.0 MB" in note, note
    finally:
        ui.close()


def test_a_run_folder_named_with_spaces_opens_from_the_runs_page(page, tmp_path):
    """Before: listed, but its link led to a 404."""
    runs = tmp_path / "runs"
    root = run_folder(runs, name="my run (v2) #1 & co", samples=1)
    ui = Dashboard(str(runs))
    try:
        page.goto(ui.url)
        page.click("tr.run a")
        page.wait_for_function("() => window.lorapod && window.lorapod.lastStep === 20")
        assert page.inner_text("h1") == root.name
        page.wait_for_function("() => [...document.querySelectorAll('.gallery img')].every(i => i.complete && i.naturalWidth > 0)")
    finally:
        ui.close()


class OtherServer:
    """Another program's web server on 127.0.0.1 (another port): it records the Cookie header of
    every request the browser sends it."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.cookies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.path, self.headers.get("cookie") or ""))
                body = b"<!doctype html><title>other</title><p>another server"
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_another_server_on_127_0_0_1_never_gets_the_dashboards_cookie(page, tmp_path):
    """Chromium scopes cookies by host and path, not port. Before: the cookie (Path=/) went to any
    server on 127.0.0.1, and whoever held it passed every check. Now it lives under the dashboard's
    random path prefix; the other server sees it on none of its own paths."""
    run_folder(tmp_path / "runs")
    ui = Dashboard(str(tmp_path / "runs"))
    other = OtherServer()
    try:
        page.goto(ui.url)
        assert page.url == ui.base + "/" and page.locator("tr.run").count() == 1
        (cookie,) = [c for c in page.context.cookies() if c["name"] == f"lorapod_ui_{ui.port}"]
        assert cookie["path"] == ui.prefix + "/" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        for path in ("/", "/runs/x", "/static/app.js", "/favicon.ico"):
            page.goto(other.base + path)
        # what the browser sends of its own accord to another port: what another user's server would read
        page.evaluate("fetch('/anything', {credentials: 'include'})")
        page.goto(ui.base + "/")  # the dashboard still works
        assert page.locator("tr.run").count() == 1
        assert other.cookies and all(ui.token not in c for _, c in other.cookies), other.cookies
        # the cookie ports do not scope (what the prefix is for): Chromium sends a Path=/ one anywhere
        page.context.add_cookies([{"name": "probe", "value": "1", "domain": "127.0.0.1", "path": "/"}])
        page.goto(other.base + "/probe")
        assert "probe=1" in other.cookies[-1][1]
    finally:
        other.close()
        ui.close()


def test_ui_open_never_puts_the_token_in_the_browsers_argv(page, tmp_path):
    """`lorapod ui --open` runs the browser with an argument every local user can read
    (/proc/PID/cmdline). Before: the token URL. Now: a file only this user can read, which sends
    the browser on to the dashboard."""
    browser = tmp_path / "browser.sh"
    argv_file = tmp_path / "argv.txt"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_file}\n')
    browser.chmod(0o755)
    run_folder(tmp_path / "runs")
    ui = Dashboard(str(tmp_path / "runs"), "--open", env={"BROWSER": f"{browser} %s"})
    try:
        wait_for(argv_file.is_file, 10, "the browser to be started")
        argv = argv_file.read_text().split()
        assert argv and all(ui.token not in a for a in argv), argv
        (target,) = argv
        assert target.startswith("file://")
        opener = Path(target.removeprefix("file://"))
        assert opener.stat().st_mode & 0o077 == 0 and opener.parent.stat().st_mode & 0o077 == 0  # this user's only
        page.goto(target)
        page.wait_for_url(ui.base + "/")
        assert page.locator("tr.run").count() == 1
    finally:
        ui.close()


# ----------------------------------------------------------------------------- remote runs on the fakes


def _remote_run(fake: RunPodFake, tmp_path: Path, steps: int, pull_every_s: float = 0.5,
                ) -> tuple[subprocess.Popen, dict[str, str]]:
    env = {"RUNPOD_API_KEY": fake.account_key, "LORAPOD_RUNPOD_URL": fake.url,
           "LORAPOD_RUNPOD_GRAPHQL_URL": fake.graphql_url}
    spec = make_spec(tmp_path, max_steps=steps, every=5)
    proc = subprocess.Popen([*cli_argv(), "run", str(spec), "--on", "runpod", "--python", sys.executable,
                             "--max-usd", "0.5", "--poll-s", "0.2", "--pull-every-s", str(pull_every_s), "--ready-deadline-s",
                             "20", "--watchdog-poll-s", "0.3", "--heartbeat-timeout-s", "3", "--stop-wait-s", "20",
                             "--reconnect-s", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.3, "--device-name 'RTX 3090'"),
                                        **env))
    return proc, env


def _job():
    jobs = Ledger().jobs()
    return jobs[0] if jobs else None


def _finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def _row_state(page, ui: Dashboard, job_id: str) -> str:
    page.goto(ui.base + "/")
    return page.locator(f"tr.run[data-job='{job_id}'] td.state").inner_text()


@pytest.mark.slow
def test_remote_run_followed_and_stopped_at_its_save(page, runpod, tmp_path):
    # Pulls only every 120 s: the chart can only move by the live read from the pod (ui/live.py).
    proc, env = _remote_run(runpod, tmp_path, steps=200, pull_every_s=120)
    ui = Dashboard(str(tmp_path), env=env)
    out = shots(tmp_path)
    try:
        wait_for(lambda: (_job() is not None and (_job().last_step or 0) >= 3), 60, "step 3 on the pod")
        job = _job()
        page.goto(ui.url)
        row = page.locator(f"tr.run[data-job='{job.id}']")
        assert row.locator("td.state").inner_text() == "running" and "RTX 3090" in row.inner_text()
        page.goto(f"{ui.base}/runs/{job.id}")
        start = page.evaluate("window.lorapod.lastStep") or 0
        took = wait_for(lambda: (page.evaluate("window.lorapod.lastStep") or 0) >= start + 3, 10,
                        "live steps from the pod on the chart")
        local = Path(job.run_dir) / "metrics.jsonl"
        assert not local.exists() or len(local.read_text().splitlines()) < page.evaluate("window.lorapod.lastStep")
        print(f"3 new steps from the pod on the chart after {took:.1f} s")
        page.wait_for_selector(".timeline .phase")  # the setup phases, as the session measured them
        page.screenshot(path=out / "run-remote.png", full_page=True)
        page.goto(ui.base + "/")
        page.screenshot(path=out / "runs-remote.png", full_page=True)
        page.goto(f"{ui.base}/runs/{job.id}")
        page.once("dialog", lambda d: (_check_dialog(d, "Nothing trained is lost"), d.accept()))
        page.click("text=Stop at the next save")
        page.wait_for_selector("#action-out[data-ok='true']")
        err = _finish(proc)
        assert proc.returncode == 0, err
    finally:
        ui.close()
    job = Ledger().job(job.id)
    assert job.state == "stopped" and job.last_step < 200, (job.state, job.summary)
    run = Path(job.run_dir)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    ckpts = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    assert ckpts[-1] == steps[-1] == job.last_step  # it ended at its save: nothing trained was lost
    assert runpod.live() == [] and Ledger().instances(live_only=True) == []
    assert runpod.violations == [], runpod.violations


@pytest.mark.slow
def test_remote_run_destroyed_from_the_page(page, runpod, tmp_path):
    proc, env = _remote_run(runpod, tmp_path, steps=200)
    ui = Dashboard(str(tmp_path), env=env)
    try:
        wait_for(lambda: (_job() is not None and (_job().last_step or 0) >= 3), 60, "step 3 on the pod")
        job = _job()
        (pod,) = runpod.live()
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/{job.id}")
        page.once("dialog", lambda d: (_check_dialog(d, "You lose"), d.accept()))
        page.click("text=Destroy now")
        page.wait_for_selector("#action-out[data-ok]", timeout=60_000)
        assert page.get_attribute("#action-out", "data-ok") == "true", page.inner_text("#action-out")
        assert pod.deleted and pod.deleted_by == "account key"  # through the control plane, with the user's key
        _finish(proc)
        ledger = Ledger()
        assert ledger.instances(live_only=True) == []
        (inst,) = ledger.job_instances(job.id)
        assert inst.state == "destroyed"
        state = ledger.job(job.id).state
        assert state in ("stopped", "failed", "interrupted"), state
        assert _row_state(page, ui, job.id) == state  # the ledger and the Runs page agree
        assert page.locator("tr.unconfirmed").count() == 0
    finally:
        ui.close()
    assert runpod.live() == [] and runpod.violations == [], runpod.violations


@pytest.mark.slow
def test_demo_then_ui_a_new_users_first_look(page, tmp_path):
    """What docs/ui.md and the README promise: `lorapod demo --image`, then `lorapod ui` in the same folder."""
    demo = subprocess.run([*cli_argv(), "demo", "--image", "--steps", "16"], cwd=tmp_path, capture_output=True,
                          text=True, env=cli_env(), timeout=180)
    assert demo.returncode == 0, demo.stderr
    (run,) = (tmp_path / "lorapod-image-demo" / "runs").iterdir()
    proc = subprocess.Popen([*cli_argv(), "ui", "--port", "0"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        url = re.search(r"http://\S+", proc.stdout.readline()).group(0)  # type: ignore[union-attr]
        page.goto(url)
        row = page.locator(f"tr.run[data-job='{run.name}']")
        assert row.locator("td.state").inner_text() == "done"
        row.locator("a").click()
        page.wait_for_url(f"**/runs/{run.name}")
        page.wait_for_function("() => window.lorapod && window.lorapod.charts.loss && window.lorapod.charts.loss.u")
        assert page.evaluate("window.lorapod.lastStep") == 16
        pngs = sorted((run / "samples").glob("*-0[0-9].png"))  # every 2 epochs of 8 steps: at step 16
        assert pngs and page.locator(".gallery img").count() == len(pngs)
        # the images are loading="lazy": bring the last one into view, then every one must load
        page.locator(".gallery img").last.scroll_into_view_if_needed()
        page.wait_for_function("() => [...document.querySelectorAll('.gallery img')].every(i => i.complete && i.naturalWidth > 0)",
                               timeout=15_000)
        assert "green" in page.locator(".gallery").first.inner_text()  # the prompt from the PNG itself
        page.screenshot(path=shots(tmp_path) / "run-demo.png", full_page=True)
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_page_left_open_while_its_job_ends_stops_offering_destroy(page, tmp_path):
    """Issue #38: a finished job's page kept a live Destroy button. Opened while the pod runs, the
    page hides Destroy and disables Stop once the status stream says the job ended."""
    from .test_ui_hostile import remote_job

    runs = tmp_path / "runs"
    root = remote_job(runs, "live-20261201-120000-0002")
    ui = Dashboard(str(runs))
    try:
        page.goto(ui.url)
        page.goto(f"{ui.base}/runs/{root.name}")
        page.wait_for_function("() => window.lorapod.statusEvents > 0")
        destroy = page.locator("button[data-needs=live]")
        assert destroy.is_visible() and destroy.is_enabled()
        ledger = Ledger()
        (inst,) = ledger.instances(live_only=True)
        ledger.instance_destroyed(inst.id)
        ledger.job_ended(root.name, "done", "finished at step 20")
        ledger.close()
        page.wait_for_function("() => document.querySelector('#status .status').dataset.live === '0'",
                               timeout=20000)
        assert not destroy.is_visible()
        assert page.locator("text=Stop at the next save").is_disabled()
    finally:
        ui.close()
