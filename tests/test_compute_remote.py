"""compute/remote.py: the command that starts the job on the instance, and the remote-run modules
loading without torch."""

from __future__ import annotations

from lorapod.compute.remote import default_job_command, job_command_from_env


def test_job_command_default_and_override(monkeypatch):
    assert default_job_command("python3", "spec.yaml", "run", False) == [
        "python3", "-m", "lorapod", "train", "spec.yaml", "--run-dir", "run"]
    assert job_command_from_env("py", "s.yaml", "run", True) == [  # resumes from run/checkpoints by itself
        "py", "-m", "lorapod", "train", "s.yaml", "--run-dir", "run"]
    monkeypatch.setenv("LORAPOD_JOB_COMMAND", "{python} my_train.py --cfg {spec} --out {run_dir} {resume}")
    assert job_command_from_env("py", "s.yaml", "run", False) == ["py", "my_train.py", "--cfg", "s.yaml", "--out", "run"]


def test_remote_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, lorapod.cli.run, lorapod.cli.jobs, lorapod.compute.session, lorapod.compute.jobs, "
            "lorapod.compute.runpod.provider, lorapod.compute.vast.provider; "
            "bad = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    from .remote_helpers import cli_env

    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env())
