"""compute/provider.py: the registry of providers by name, and capabilities with their reasons."""

from __future__ import annotations

import os
import time

import pytest

from lorapod.compute import provider as registry
from lorapod.compute.provider import Capability, InstanceSpec
from lorapod.errors import ProviderError


def test_registry_refuses_duplicates_and_builtin_names():
    name = f"myprov_{os.getpid()}_{time.monotonic_ns()}"
    registry.register(name, lambda **kw: "x")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(name, lambda **kw: "y")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("runpod", lambda **kw: "z")
    assert registry.get(name) == "x"
    assert {"ssh", "local", "runpod", "vast", name} <= set(registry.names())


def test_unknown_provider_lists_the_known_ones():
    with pytest.raises(ProviderError, match="unknown provider 'aws'") as exc:
        registry.get("aws")
    assert "runpod" in exc.value.hint and "ssh://" in exc.value.hint


def test_capabilities_have_reasons():
    from lorapod.compute.ssh import SSHProvider

    caps = SSHProvider("ssh://u@h:22").capabilities()
    assert all(isinstance(c, Capability) and c.reason for c in caps)
    assert not next(c for c in caps if c.name == "stop").supported
    InstanceSpec("x", "ssh-ed25519 AAA")  # constructible with defaults
