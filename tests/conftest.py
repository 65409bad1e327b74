"""Test-wide isolation: every test gets its own LORAPOD_HOME and never talks to a hub."""

from __future__ import annotations

import os

import pytest

from .conftest_ssh import remote_root, sshd, sshd_factory  # noqa: F401  (real-sshd fixtures for remote runs)

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
    # Provider keys and URL overrides never leak in from the environment running the tests.
    for key in ("RUNPOD_API_KEY", "VAST_API_KEY", "LORAPOD_JOB_COMMAND", "LORAPOD_RUNPOD_URL",
                "LORAPOD_RUNPOD_GRAPHQL_URL", "LORAPOD_VAST_URL", "LORAPOD_REMOTE_ROOT"):
        monkeypatch.delenv(key, raising=False)
    return home


@pytest.fixture
def runpod(sshd_factory, remote_root):  # noqa: F811  (pytest fixtures by name, imported above)
    """The RunPod fake control plane (tests/fakes/runpod_fake.py), its instances real sshds on loopback."""
    from .fakes.runpod_fake import RunPodFake

    fake = RunPodFake(sshd_factory, remote_root)
    yield fake
    fake.close()
