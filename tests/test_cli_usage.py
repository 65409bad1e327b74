"""Usage errors through the installed ``lorapod`` entry point: the usage line, no traceback, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def entry_point() -> str:
    here = Path(sys.executable).parent / "lorapod"
    found = str(here) if here.is_file() else shutil.which("lorapod")
    if not found:
        pytest.skip("the lorapod entry point is not installed (pip install -e .)")
    return found


@pytest.mark.parametrize(("argv", "says"), [
    (["trian"], ["No such command 'trian'", "Did you mean 'train'?", "Usage: lorapod"]),
    (["plan", "--foo"], ["No such option: --foo", "Usage: lorapod plan"]),
    (["run", "--bootstrap"], ["Option '--bootstrap' requires an argument"]),
])
def test_usage_errors_show_usage_and_exit_2(argv, says):
    proc = subprocess.run([entry_point(), *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LORAPOD_DEBUG": ""})
    assert proc.returncode == 2, proc.stderr
    for text in says:
        assert text in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
