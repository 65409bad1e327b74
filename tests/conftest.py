"""Test-wide isolation: every test gets its own LORAPOD_HOME and never talks to a hub."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _lorapod_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("lorapod-home")
    monkeypatch.setenv("LORAPOD_HOME", str(home))
    return home
