"""README's test command on a fresh clone: a `git clone` into a folder with no ../shared beside it
runs the provider tests, whose fakes check every request against the contracts in tests/contracts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .remote_helpers import REPO


def test_provider_tests_pass_on_a_fresh_clone(tmp_path):
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path / "lorapod"
    assert not (tmp_path / "shared").exists()
    for cmd in (["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)],
                ["git", "-C", str(clone), "checkout", "-q", head.stdout.strip()]):
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "LORAPOD_CONTRACTS_DIR"}
    env["PYTHONPATH"] = str(clone / "src")  # the clone's lorapod, not this checkout's
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_compute_providers.py", "tests/test_compute_live_prices.py",
         "-k", "bad_key or unknown_gpu or contract_violation or idempotent or insufficient or live_prices"],
        cwd=clone, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "error" not in proc.stdout.splitlines()[-1]
    assert "lorapod/src/lorapod" in subprocess.run(
        [sys.executable, "-c", "import lorapod; print(lorapod.__file__)"], cwd=clone, env=env,
        capture_output=True, text=True).stdout
