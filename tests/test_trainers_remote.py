"""`lorapod run --trainer sd-scripts` end to end over the loopback SSH host, with the sd-scripts
STAND-IN (tests/standins/sd-scripts) writing sd-scripts' real output layout: metrics, samples and
checkpoints arrive, STOP and the $ cap work, a failing setup is reported, nothing is left alive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorapod.compute.session import run_remote
from lorapod.compute.ssh import SSHProvider
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger
from lorapod.trainers.on_instance import trainer_job_command

from .remote_helpers import cli_argv, cli_env, fast_options
from .test_cli_run_remote import FAST
from .test_compute_session import assert_clean

STANDIN = Path(__file__).resolve().parent / "standins" / "sd-scripts"


def image_spec(tmp: Path, epochs: int, save: dict, images: int = 3, repeats: int = 2) -> Path:
    data = tmp / "mug"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(images):
        (data / f"p{i}.png").write_bytes(b"\x89PNG stand-in")
        (data / f"p{i}.txt").write_text(f"zxq_mug, photo {i}\n")
    spec = {"model": {"id": "stabilityai/stable-diffusion-xl-base-1.0", "family": "sdxl"},
            "method": {"r": 4, "alpha": 4, "dropout": 0.0},
            "data": {"path": "mug", "format": "images", "repeats": repeats, "trigger": "zxq_mug"},
            "train": {"epochs": epochs, "optimizer": "adamw"}, "save": save,
            "samples": {"prompts": ["zxq_mug on a table"], "every_epochs": 1},
            "output": {"dir": str(tmp / "runs"), "name": "mug"}}
    path = tmp / "mug.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def go(sshd, spec_path: Path, src: str, **kw):
    spec = load_spec(spec_path)
    provider = SSHProvider(sshd.target, identity=sshd.client_key, usd_per_hour=kw.pop("usd_per_hour", 0.0))
    opts = fast_options(identity=sshd.client_key, job_command=trainer_job_command("sd-scripts", src),
                        trainer="sd-scripts", **kw)
    lines: list[str] = []
    summary = run_remote(spec, provider, sshd.target, opts, Ledger(), str(spec_path), say=lines.append)
    return summary, lines


def test_sd_scripts_over_ssh_brings_metrics_samples_checkpoints_home(sshd, tmp_path):
    summary, lines = go(sshd, image_spec(tmp_path, epochs=3, save={"every_epochs": 1, "keep_last": 5}), str(STANDIN))
    assert summary.state == "done", summary.message + "\n" + "\n".join(lines)
    run = summary.run_dir
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 19))  # 3 images x 2 repeats x 3 epochs
    assert recs[0]["loss"] == 0.2 and recs[-1]["epoch"] == 3 and recs[0]["total_steps"] == 18
    # the epoch saves kept, and the final state sd-scripts saves at the end (--save_state), stamped with its step
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch-1", "epoch-2", "last"]
    assert json.loads((run / "checkpoints/last/step.json").read_text()) == {"step": 18}
    assert (run / "checkpoints" / "epoch-2" / "mug-000002.safetensors").is_file()
    assert json.loads((run / "checkpoints/epoch-2/state/train_state.json").read_text())["current_step"] == 12
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "mug_e000001_00_20261201000000.png", "mug_e000002_00_20261201000000.png"]
    assert (run / "adapter" / "mug.safetensors").read_bytes() == b"final" * 2048
    assert "lorapod trainer-run: done at step 18" in (run / "job.log").read_text()
    assert json.loads((run / "trainer.json").read_text()) == {"trainer": "sd-scripts"}  # what --resume continues with
    assert_clean(sshd, Ledger())


@pytest.mark.slow
def test_sd_scripts_budget_cap_stops_at_its_next_save(sshd, tmp_path):
    # $36/h with a $0.25 cap = 25 s; STOP 12 s before it. 600 steps at 0.1 s would need 60 s.
    spec = image_spec(tmp_path, epochs=1, save={"every_steps": 20, "every_epochs": None, "keep_last": 2},
                      images=10, repeats=60)
    summary, lines = go(sshd, spec, str(STANDIN), usd_per_hour=36.0, max_usd=0.25, stop_margin_s=12.0)
    assert summary.state == "stopped", summary.message + "\n" + "\n".join(lines)
    run = summary.run_dir
    keys = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert keys and all(k.startswith("step-") for k in keys)  # the instance kept 2; home keeps all pulled
    newest = max(keys, key=lambda k: int(k.split("-")[1]))
    assert (run / "checkpoints" / newest / "state" / "train_state.json").is_file()
    assert not (run / "adapter").exists() or not any((run / "adapter").iterdir())
    assert "STOP honoured" in (run / "job.log").read_text()
    assert summary.usd <= 0.25
    assert_clean(sshd, Ledger())


def test_trainer_setup_failure_is_reported_and_torn_down(sshd, tmp_path):
    """Through the real CLI: `lorapod run --trainer ... --trainer-src <a repo that is not there>`."""
    spec = image_spec(tmp_path, epochs=1, save={"every_epochs": 1})
    proc = subprocess.run([*cli_argv(), "run", str(spec), "--trainer", "sd-scripts", "--trainer-src",
                           "file:///nonexistent/sd-scripts.git", "--on", sshd.target, "--identity", str(sshd.client_key),
                           "--python", sys.executable, "--force", *FAST], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "the job failed on the instance (exit 1)" in " ".join(proc.stderr.split())
    ledger = Ledger()
    assert_clean(sshd, ledger)
    (job,) = ledger.jobs()
    log = " ".join((tmp_path / "runs" / job.id / "job.log").read_text().split())  # unwrap the console's lines
    assert "kohya sd-scripts setup failed at 'clone file:///nonexistent/sd-scripts.git at 48d368f" in log
    assert "--trainer-src" in log  # the fix
