"""The CLI as a user meets it: in-process (CliRunner) for speed, once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from lorapod.cli.main import build_app, main

from .llm_fixtures import make_model_dir, spec_dict, write_data

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_commands_without_importing_torch():
    code = "import sys; from lorapod.cli.main import build_app; build_app(); print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
    res = CliRunner().invoke(build_app(), ["--help"])
    assert res.exit_code == 0 and "train" in res.output and "demo" in res.output


def test_train_with_set_override(tmp_path):
    model_dir = make_model_dir(tmp_path)
    tr, va = write_data(tmp_path)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec_dict(model_dir, tr, va, tmp_path / "runs")))
    res = CliRunner().invoke(build_app(), ["train", str(spec_file), "--set", "train.max_steps=2",
                                           "--set", "train.learning_rate=1e-3"])
    assert res.exit_code == 0, res.output
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    saved = yaml.safe_load((runs[0] / "spec.yaml").read_text())
    assert saved["train"]["learning_rate"] == 1e-3 and saved["train"]["max_steps"] == 2
    steps = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps) == 2
    assert (runs[0] / "adapter" / "adapter_model.safetensors").is_file()


def test_errors_are_one_message_without_traceback(tmp_path, capsys):
    bad = tmp_path / "job.yaml"
    bad.write_text(yaml.safe_dump({"model": {"id": "x"}, "data": {"path": "d.jsonl"}, "train": {"lr": 1}}))
    try:
        main(["train", str(bad)])
    except SystemExit as exc:
        assert exc.code == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.lr'" in err
    assert "Traceback" not in err


def test_demo_as_a_real_subprocess(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "LORAPOD_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "lorapod", "demo", "--out", str(tmp_path / "d"), "--steps", "120"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    d = tmp_path / "d"
    for rel in ("base-model/config.json", "adapter/adapter_config.json", "adapter/adapter_model.safetensors",
                "metrics.jsonl", "spec.yaml"):
        assert (d / rel).is_file(), rel
    assert "validation loss" in out.stdout
    evals = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] / 2
