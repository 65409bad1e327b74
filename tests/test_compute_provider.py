"""compute/provider.py: the registry of providers by name, and capabilities with their reasons."""

from __future__ import annotations

import os
import time

import pytest

from lorapod.compute import provider as registry
from lorapod.compute.provider import Capability, InstanceSpec
from lorapod.errors import ProviderError


class Plugged(registry.ProviderBase):
    """A plugin's provider class: built with from_kwargs, its traits read without building it."""

    traits = registry.Traits(borrowed=True)

    @classmethod
    def from_kwargs(cls, **kw):
        return "x"


def test_registry_takes_classes_and_refuses_duplicates_and_builtin_names(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    name = f"myprov_{os.getpid()}_{time.monotonic_ns()}"
    registry.register(name, Plugged)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(name, Plugged)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("runpod", Plugged)
    with pytest.raises(ValueError, match="must be a class"):
        registry.register(name + "_f", lambda **kw: "y")  # a factory's traits cannot be read: refused
    assert registry.get(name) == "x"
    assert registry.declared_traits(name) == Plugged.traits  # a plugin's traits, read like a built-in's
    assert name not in registry.rented_providers()  # it declares a borrowed host
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
