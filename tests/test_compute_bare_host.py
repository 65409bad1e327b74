"""`lorapod run` against a host whose Python is BARE: a fresh virtualenv holding only torch, the way
GPU images ship. The real CLI, a real OpenSSH server on loopback, real installs from the machine's
package index (with its warm cache), the real demo training: the bootstrap must build the job's
environment there, and a second job must reuse it without installing anything.

A second host's index answers 404 to everything: the run must fail with the package and the fix,
destroy the instance (the host's work folder) and say why in the ledger.
"""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lorapod.compute.bootstrap import ENVS_DIR, derive_lock
from lorapod.store.ledger import Ledger

from .bare_host import caches, index_reachable, make_bare_python, pip_index_settings, setenv_line
from .remote_helpers import REPO, cli_argv, cli_env

FAST = ["--poll-s", "0.3", "--pull-every-s", "1", "--ready-deadline-s", "30", "--stop-margin-s", "1",
        "--stop-wait-s", "20", "--reconnect-s", "30", "--watchdog-poll-s", "0.5"]
@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> str:
    """A fresh virtualenv with torch and nothing else: what a GPU image's Python looks like."""
    why = index_reachable(pip_index_settings())
    if why:
        pytest.skip(why)
    return make_bare_python(tmp_path_factory.mktemp("bare") / "py")


def lorapod_run(sshd, python: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [*cli_argv(), "run", str(REPO / "examples" / "demo.yaml"), "--on", sshd.target,
            "--identity", str(sshd.client_key), "--python", python, "--json", *FAST,
            "--set", "train.max_steps=4", "--set", "save.every_steps=2", "--set", "eval.every_steps=4",
            "--set", f"output.dir={run_dir}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=cli_env())


def phases(job_id: str) -> dict[str, dict]:
    return {e["phase"]: e for e in (json.loads(r["message"]) for r in Ledger().events(job_id) if r["kind"] == "phase")}


def alive_under(path: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(path)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.slow
def test_bare_host_gets_its_environment_and_a_second_job_reuses_it(sshd_factory, bare_python, tmp_path):
    sshd = sshd_factory(setenv_line({**pip_index_settings(), **caches()}))
    first = lorapod_run(sshd, bare_python, tmp_path / "runs")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    assert summary["state"] == "done" and summary["last_step"] == 4
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    env_phase = phases(summary["job_id"])["environment"]
    assert env_phase["note"].startswith("installed "), env_phase
    # Nothing left: the job's work folder is gone, no process runs from it; only the env cache stays.
    root = sshd.work_root
    assert sorted(p.name for p in root.iterdir()) == [ENVS_DIR]
    assert alive_under(root / summary["job_id"]) == []
    assert Ledger().instances(live_only=True) == []
    ps = subprocess.run([*cli_argv(), "ps", "--json"], capture_output=True, text=True, timeout=60, env=cli_env())
    (row,) = json.loads(ps.stdout)
    assert list(row["setup_s"]) == ["boot", "ssh ready", "environment", "data sync", "first step"]
    (env,) = [p for p in (root / ENVS_DIR).iterdir() if p.is_dir()]
    assert env.name == derive_lock("llm").digest
    ready = (env / ".ready").stat().st_mtime_ns
    site = sorted(p.name for p in next(env.glob("lib/python*/site-packages")).iterdir())

    second = lorapod_run(sshd, bare_python, tmp_path / "runs2")
    assert second.returncode == 0, second.stderr[-3000:]
    summary2 = json.loads(second.stdout)
    assert summary2["state"] == "done"
    note = phases(summary2["job_id"])["environment"]["note"]
    assert note.startswith(f"reused the environment {env}; installed nothing"), note
    # No install ran: the env is untouched, file for file.
    assert (env / ".ready").stat().st_mtime_ns == ready
    assert sorted(p.name for p in next(env.glob("lib/python*/site-packages")).iterdir()) == site
    assert sorted(p.name for p in root.iterdir()) == [ENVS_DIR]


class NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


@pytest.mark.slow
def test_an_index_that_answers_404_fails_clearly_and_destroys(sshd_factory, bare_python, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        sshd = sshd_factory(setenv_line({"PIP_INDEX_URL": index, "PIP_CONFIG_FILE": "/dev/null"}))
        proc = lorapod_run(sshd, bare_python, tmp_path / "runs")
    finally:
        server.shutdown()
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    pins = {p.partition("==")[0] for p in derive_lock("llm").pins}
    (job,) = Ledger().jobs()
    line = next(x for x in proc.stderr.splitlines() if "could not install" in x)
    named = line.split("could not install ", 1)[1].split("==")[0]
    assert named in pins and index in line
    assert "PIP_INDEX_URL" in proc.stderr and "--image" in proc.stderr
    assert job.state == "failed" and f"could not install {named}" in (job.summary or "")
    assert Ledger().instances(live_only=True) == []
    # The instance (the host's work folder) is gone and no half-built env is left behind.
    assert [p.name for p in sshd.work_root.iterdir()] in ([], [ENVS_DIR])
    assert [p.name for p in (sshd.work_root / ENVS_DIR).glob("*") if p.is_dir()] == []
