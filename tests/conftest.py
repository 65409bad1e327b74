"""Shared test setup: every test gets its own LORAPOD_HOME (ledger, keys, known_hosts)."""

from __future__ import annotations

import pytest

from conftest_ssh import remote_root, sshd, sshd_factory  # noqa: F401  (real-sshd fixtures)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "lorapod-home"))
    for key in ("RUNPOD_API_KEY", "VAST_API_KEY", "LORAPOD_JOB_COMMAND", "LORAPOD_RUNPOD_URL", "LORAPOD_VAST_URL"):
        monkeypatch.delenv(key, raising=False)
