"""What a newcomer meets at the terminal (issue #24), through the installed entry point ``python -m lorapod``:
a pipe where the terminal must not matter, a pty where it does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def lorapod(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """``python -m lorapod ARGS`` as a separate process, stdout and stderr pipes (not a terminal)."""
    e = dict(os.environ, PYTHONPATH=SRC, COLUMNS="100") | (env or {})
    return subprocess.run([sys.executable, "-m", "lorapod", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=e)


def test_eval_on_a_video_run_says_what_to_look_at_instead_of_a_traceback(tmp_path):
    from lorapod.demo_video import demo_spec_dict
    from lorapod.rundir import RunDir
    from lorapod.spec import JobSpec

    raw = demo_spec_dict(tmp_path, str(tmp_path / "base-model"), 2)
    (tmp_path / "data" / "2_zxq").mkdir(parents=True)
    run = RunDir.create(tmp_path / "runs", "video")
    run.write_spec(JobSpec.model_validate(raw))
    got = lorapod("eval", str(run.root))
    assert got.returncode == 2, got.stderr  # a SpecError
    assert "Traceback" not in got.stderr + got.stdout
    assert "is a video run (wan21)" in got.stderr and "samples" in got.stderr
