"""compute/prepare.py: what `lorapod run` and `lorapod sweep` check before renting, in one place."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from lorapod.compute.session import RunOptions
from lorapod.errors import LorapodError
from lorapod.store.ledger import Ledger

from .remote_helpers import cli_argv, cli_env, make_spec

KNOBS = ("poll_s", "pull_every_s", "ready_deadline_s", "stop_margin_s", "stop_wait_s", "reconnect_s",
         "destroy_deadline_s")


def test_a_sweep_with_one_bad_job_rents_nothing_and_names_the_job(runpod, tmp_path):
    spec = make_spec(tmp_path, model="lorapod:tiny-llama")
    good, missing = tmp_path / "data" / "train.jsonl", tmp_path / "nowhere.jsonl"
    env = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                  LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url, HF_HUB_OFFLINE="1")
    proc = subprocess.run([*cli_argv(), "sweep", str(spec), "--grid", f"data.path={good},{missing}",
                           "--on", "runpod", "--max-usd", "1"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())  # rich wraps long lines
    assert "sweep job 2 (path=" in said and "on runpod: data path" in said and "does not exist" in said, proc.stderr
    # job 1 is fine and would have been started first: nothing was asked of the control plane
    assert runpod.calls == [], runpod.calls
    assert runpod.instances == {}
    assert Ledger().instances() == []


def test_run_hidden_knobs_default_to_run_options_and_reach_it_when_given(tmp_path, monkeypatch):
    import lorapod.compute.session as session
    from lorapod.cli.main import build_app

    seen: list[RunOptions] = []

    def captured(spec, provider, target, opts, *args, **kwargs):
        seen.append(opts)
        raise LorapodError("captured")

    monkeypatch.setattr(session, "run_remote", captured)
    spec = str(make_spec(tmp_path, model="lorapod:tiny-llama"))
    app = build_app()
    CliRunner().invoke(app, ["run", spec, "--on", "local"])
    CliRunner().invoke(app, ["run", spec, "--on", "local", "--poll-s", "0.7", "--watchdog-poll-s", "0.3",
                             "--stall-s", "9"])
    plain, given = seen
    defaults = RunOptions()
    assert {k: getattr(plain, k) for k in KNOBS} == {k: getattr(defaults, k) for k in KNOBS}
    assert plain.watchdog == {}  # watchdog.DEFAULTS hold on the instance
    assert given.poll_s == 0.7 and given.watchdog == {"poll_s": 0.3, "stall_s": 9.0}
    assert {k: getattr(given, k) for k in KNOBS if k != "poll_s"} == {k: getattr(defaults, k) for k in KNOBS
                                                                      if k != "poll_s"}


def test_a_sweep_refuses_sky_before_anything(tmp_path):
    from lorapod.compute.prepare import prepare_sweep
    from lorapod.errors import SpecError

    with pytest.raises(SpecError, match="sweeps do not run on sky"):
        prepare_sweep(make_spec(tmp_path), ["train.learning_rate=1e-4,2e-4"], ["sky"])


def test_preparing_a_run_imports_no_torch():
    """The controller of a one-GPU job needs no torch (lorapod's core install has none; with
    --deps none nothing else asks for it here): torchrun's command is built only for compute.gpus > 1."""
    import sys

    code = ("import sys, lorapod.compute.prepare, lorapod.compute.sweep; "
            "bad = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
