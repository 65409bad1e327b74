"""No API key is ever printed, logged, written, put on a command line, or sent to the instance.

A whole `lorapod run --on runpod` (fake control plane, real sshd) with a recognisable account key
and HF token: while it runs, every process's command line is sampled; afterwards every file
lorapod or the "instance" wrote, and everything printed, is searched for both.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import threading
from pathlib import Path

from .fakes.base import marked_pids
from .fakes.runpod_fake import RunPodFake
from .remote_helpers import cli_argv, cli_env, fake_command_template, make_spec


def _scan_cmdlines(needles: list[bytes], hits: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            hits.extend(f"pid {d.name}: {cmd[:120]!r}" for n in needles if n in cmd)
        stop.wait(0.05)


def _files_under(*roots: Path) -> list[Path]:
    return [p for r in roots if r.exists() for p in r.rglob("*") if p.is_file()]


def test_keys_never_leak(sshd_factory, remote_root, tmp_path, monkeypatch):
    account_key = "rpa_" + secrets.token_hex(16)
    hf_token = "hf_" + secrets.token_hex(16)
    fake = RunPodFake(sshd_factory, remote_root, account_key=account_key)
    instance_env_hits: list[str] = []
    try:
        spec = make_spec(tmp_path, max_steps=10)
        env = cli_env(RUNPOD_API_KEY=account_key, HF_TOKEN=hf_token, LORAPOD_RUNPOD_URL=fake.url,
                      LORAPOD_RUNPOD_GRAPHQL_URL=fake.graphql_url, LORAPOD_JOB_COMMAND=fake_command_template(0.1))
        hits: list[str] = []
        stop = threading.Event()
        scanner = threading.Thread(target=_scan_cmdlines, args=([account_key.encode(), hf_token.encode()], hits, stop))
        scanner.start()
        proc = subprocess.Popen([*cli_argv(), "run", str(spec), "--on", "runpod", "--python", sys.executable,
                                 "--poll-s", "0.2", "--pull-every-s", "0.5", "--watchdog-poll-s", "0.3", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        # While it runs: no process on the instance has the account key in its environment.
        while proc.poll() is None:
            for inst in list(fake.instances.values()):
                for pid in marked_pids(inst.marker):
                    try:
                        if account_key.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                            instance_env_hits.append(str(pid))
                    except OSError:
                        pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.1)
        out, err = proc.communicate()
        stop.set()
        scanner.join()
        assert proc.returncode == 0, err.decode()
        assert hits == [], hits
        assert instance_env_hits == []
        printed = out + err
        assert account_key.encode() not in printed and hf_token.encode() not in printed
        written = _files_under(tmp_path, remote_root, Path(env["LORAPOD_HOME"]),
                               *[i.sshd.dir for i in fake.instances.values()])
        assert any(p.name == "ledger.db" for p in written) and any(p.name == "metrics.jsonl" for p in written)
        for p in written:
            data = p.read_bytes()
            assert account_key.encode() not in data, f"account key in {p}"
            assert hf_token.encode() not in data, f"HF token in {p}"
        # The job did get the token it needs (through a 0600 file read by job.sh, not argv).
        events = next(p for p in written if p.name == "events.log").read_text()
        assert "HF_TOKEN present" in events
        assert fake.violations == []
    finally:
        fake.close()
