"""No API key is ever printed, logged, written, put on a command line, or sent to the instance.

A whole `lorapod run --on runpod` (fake control plane, real sshd) with a recognisable account key
and HF token: while it runs, every process's command line is sampled and the instance's own
files are checked (the token only in a 0600 secrets.env); afterwards every file lorapod or the
"instance" wrote, and everything printed, is searched for both. The token is sent only because
the run names it (--forward-env): by default a non-gated model gets nothing, and a gated one
gets HF_TOKEN only on a verified/secure host.
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
    secret_files: dict[str, int] = {}  # secrets.env on the instance -> its mode
    try:
        spec = make_spec(tmp_path, max_steps=10)
        env = cli_env(RUNPOD_API_KEY=account_key, HF_TOKEN=hf_token, LORAPOD_RUNPOD_URL=fake.url,
                      LORAPOD_RUNPOD_GRAPHQL_URL=fake.graphql_url, LORAPOD_JOB_COMMAND=fake_command_template(0.1))
        hits: list[str] = []
        stop = threading.Event()
        scanner = threading.Thread(target=_scan_cmdlines, args=([account_key.encode(), hf_token.encode()], hits, stop))
        scanner.start()
        proc = subprocess.Popen([*cli_argv(), "run", str(spec), "--on", "runpod", "--python", sys.executable,
                                 "--poll-s", "0.2", "--pull-every-s", "0.5", "--watchdog-poll-s", "0.3", "--json",
                                 "--forward-env", "HF_TOKEN"],
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
            for f in remote_root.glob("*/*"):  # the instance's own files, while they exist
                with contextlib.suppress(OSError):
                    if hf_token.encode() in f.read_bytes():
                        secret_files[f.name] = f.stat().st_mode & 0o777
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.1)
        out, err = proc.communicate()
        stop.set()
        scanner.join()
        assert proc.returncode == 0, err.decode()
        assert hits == [], hits
        assert instance_env_hits == []
        assert secret_files == {"secrets.env": 0o600}  # the only file on the instance with the token
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


def test_default_forwards_only_what_the_job_needs_and_only_to_secure_hosts(tmp_path):
    from lorapod.compute.provider import Offer
    from lorapod.compute.secrets import secrets_for
    from lorapod.spec import load_spec

    tiny = load_spec(make_spec(tmp_path))
    gated = tiny.model_copy(deep=True)
    gated.model.id, gated.model.family = "meta-llama/Llama-3.1-8B-Instruct", "llm"
    secure = Offer("runpod", "A|SECURE", "A40", 0.44, secure=True)
    community = Offer("runpod", "B|COMMUNITY", "RTX 3090", 0.22, secure=False)
    assert secrets_for(tiny, secure, None) == ([], None)  # nothing gated: nothing sent
    assert secrets_for(gated, secure, None) == (["HF_TOKEN"], None)
    names, why = secrets_for(gated, community, None)
    assert names == [] and "--forward-env HF_TOKEN" in why
    assert secrets_for(tiny, community, ("WANDB_API_KEY", "HF_TOKEN")) == (["WANDB_API_KEY", "HF_TOKEN"], None)


def test_wandb_key_goes_only_when_the_job_logs_to_wandb_online(tmp_path):
    from lorapod.compute.provider import Offer
    from lorapod.compute.secrets import secrets_for
    from lorapod.spec import WandbSpec, load_spec

    tiny = load_spec(make_spec(tmp_path))
    secure = Offer("runpod", "A|SECURE", "A40", 0.44, secure=True)
    community = Offer("vast", "7", "RTX 3090", 0.12, secure=False)
    assert secrets_for(tiny, secure, None) == ([], None)  # W&B off: the key stays home
    on = tiny.model_copy(deep=True)
    on.tracking.wandb = WandbSpec(project="p")
    assert secrets_for(on, secure, None) == (["WANDB_API_KEY"], None)
    names, why = secrets_for(on, community, None)
    assert names == [] and "wandb sync" in why
    on.tracking.wandb.mode = "offline"  # files only: no key needed
    assert secrets_for(on, secure, None) == ([], None)


def test_vast_scoped_key_file_is_root_only(tmp_path):
    """The instance's start script puts CONTAINER_API_KEY in a 0600 file, not /etc/environment."""
    import os

    from lorapod.compute.vast.provider import onstart_script

    target = tmp_path / "instance.env"
    script = onstart_script(str(target))
    assert "/etc/environment" not in script
    env = {"PATH": os.environ["PATH"], "CONTAINER_ID": "70001", "CONTAINER_API_KEY": "ck-secret", "OTHER": "x"}
    subprocess.run(["bash", "-c", script], env=env, check=True)
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(target.read_text().split()) == ["CONTAINER_API_KEY=ck-secret", "CONTAINER_ID=70001"]
