"""Test-wide isolation: every test gets its own LORAPOD_HOME and never talks to a hub."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests run two xdist workers on two cores: one intra-op thread each avoids OpenMP spin-waiting
# on an oversubscribed CPU, which slows tiny-model steps down by 10x or more.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _lorapod_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("lorapod-home")
    monkeypatch.setenv("LORAPOD_HOME", str(home))
    return home
