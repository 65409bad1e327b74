"""compute/httpapi.py: provider API keys, from the environment, then a private file."""

from __future__ import annotations

import os

import pytest

from lorapod.compute.httpapi import api_key, save_api_key
from lorapod.errors import ProviderError


def test_api_key_from_env_then_private_file(monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "from-env")
    assert api_key("RUNPOD_API_KEY", "runpod") == "from-env"
    monkeypatch.delenv("RUNPOD_API_KEY")
    with pytest.raises(ProviderError, match="no runpod API key") as exc:
        api_key("RUNPOD_API_KEY", "runpod")
    assert "chmod 600" in exc.value.hint
    path = save_api_key("runpod", "from-file")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert api_key("RUNPOD_API_KEY", "runpod") == "from-file"
    os.chmod(path, 0o644)
    with pytest.raises(ProviderError, match="readable by others"):
        api_key("RUNPOD_API_KEY", "runpod")
