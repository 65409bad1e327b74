"""Helpers for the remote-run tests: a tiny spec + dataset, the stand-in trainer, the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import yaml

from lorapod.compute.remote import Bootstrap
from lorapod.compute.session import RunOptions

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAKE_TRAINER = HERE / "fake_trainer.py"


def make_spec(tmp: Path, max_steps: int = 8, every: int = 4, n_examples: int = 20, model: str = "tiny-test-model",
              **compute) -> Path:
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as fh:
        for i in range(n_examples):
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                              {"role": "assistant", "content": f"a{i}"}]}) + "\n")
    spec = {
        "model": {"id": model, "family": "llm"},
        "data": {"path": "data/train.jsonl"},
        "train": {"max_steps": max_steps},
        "save": {"every_steps": every},
        "compute": compute,
        "output": {"dir": str(tmp / "runs"), "name": "demo"},
    }
    path = tmp / "demo.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def fake_command(step_s: float = 0.1, extra: tuple[str, ...] = ()):
    def cmd(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
        return [python, str(FAKE_TRAINER), spec, "--run-dir", run_dir, "--step-s", str(step_s), *extra,
                *(["--resume"] if resume else [])]

    return cmd


def fake_command_template(step_s: float = 0.1, extra: str = "") -> str:
    """The same, as the LORAPOD_JOB_COMMAND template the CLI reads."""
    return f"{{python}} {FAKE_TRAINER} {{spec}} --run-dir {{run_dir}} --step-s {step_s} {extra} {{resume}}"


def fast_options(**kw) -> RunOptions:
    base = dict(bootstrap=Bootstrap("source", python=sys.executable), poll_s=0.2, pull_every_s=0.5,
                ready_deadline_s=20, reconnect_s=20, stop_margin_s=1.0, stop_wait_s=10, destroy_deadline_s=20,
                watchdog={"poll_s": 0.3, "heartbeat_timeout_s": 3, "done_grace_s": 30, "stall_s": 60},
                every_step=True)  # the tests' say() callbacks act on each step's line
    base.update(kw)
    return RunOptions(**base)


def cli_argv() -> list[str]:
    """`python -m lorapod` with whatever command modules this checkout has.

    The real entry point, except that command groups whose module is not in this checkout yet
    (another engineer's) are left out; once all are merged this is exactly `python -m lorapod`.
    """
    code = ("import importlib.util as u, lorapod.cli.main as m; "
            "m.COMMANDS = [c for c in m.COMMANDS if u.find_spec('lorapod.cli.' + c)]; m.main()")
    return [sys.executable, "-c", code]


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
