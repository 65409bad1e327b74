"""The provider contract is on the interface (compute/provider.py), and lorapod decides by what a
provider declares (its traits and capabilities), never by its name: a provider nobody has heard
of is treated by what it says it is."""

from __future__ import annotations

import importlib
from typing import get_type_hints

import pytest
import yaml

from lorapod.compute import provider as registry
from lorapod.compute.offers import planned_job
from lorapod.compute.preflight import PreflightError, preflight
from lorapod.compute.provider import Capability, Provider, ProviderBase, Traits, capability
from lorapod.spec import load_spec

from .remote_helpers import make_spec


def _builtin(name: str) -> type:
    module, _, cls = registry.BUILTINS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


# every member of the Protocol: its methods and its declared attributes
MEMBERS = sorted({*get_type_hints(Provider), *(m for m in vars(Provider) if not m.startswith("_"))})


@pytest.mark.parametrize("name", sorted(registry.BUILTINS))
def test_every_builtin_provider_implements_the_whole_contract(name):
    cls = _builtin(name)
    assert {"traits", "transport", "cache_root", "image", "capabilities", "watchdog_config"} <= set(MEMBERS)
    assert [m for m in MEMBERS if not hasattr(cls, m)] == []
    assert isinstance(cls.traits, Traits)
    assert registry.declared_traits(name) == cls.traits


def test_the_traits_say_what_each_builtin_is():
    traits = {name: registry.declared_traits(name) for name in registry.BUILTINS}
    assert {n for n, t in traits.items() if t.borrowed} == {"ssh", "local"}
    assert {n for n, t in traits.items() if t.runs_here} == {"local"}
    assert {n for n, t in traits.items() if t.key_arrives_late} == {"vast"}
    assert {n for n, t in traits.items() if t.console_url} == {"runpod", "vast"}
    assert registry.rented_providers() == ["runpod", "vast"]


class Newcomer(ProviderBase):
    """A provider lorapod has never heard of, renting machines (the defaults)."""

    name = "newcomer"

    def capabilities(self) -> list[Capability]:
        return [Capability("watchdog_api", True, "an instance-scoped key")]


class BorrowedRunpod(ProviderBase):
    """Named like a rented provider, but declares a borrowed host: its traits decide, not its name."""

    name = "runpod"
    traits = Traits(borrowed=True)

    def capabilities(self) -> list[Capability]:
        return []


def _too_small_disk(tmp_path) -> object:
    path = make_spec(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["model"]["id"] = "Qwen/Qwen2.5-14B"  # ~29.5 GB to download: 20 GB cannot hold it
    raw.setdefault("compute", {})["disk_gb"] = 20
    path.write_text(yaml.safe_dump(raw))
    return load_spec(str(path))


def test_preflight_checks_the_disk_of_a_rented_machine_by_its_traits_not_its_name(tmp_path):
    spec = _too_small_disk(tmp_path)
    job = planned_job(spec)
    with pytest.raises(PreflightError, match="disk_gb"):
        preflight(spec, Newcomer(), job, env={"HF_HUB_OFFLINE": "1"})
    assert preflight(spec, BorrowedRunpod(), job, env={"HF_HUB_OFFLINE": "1"}).disk_needed_gb is None


def test_preflight_takes_the_provider_object_only():
    """No name-based path is left: a name is refused by the type (production passes the object,
    compute/prepare.py), so a plugin gets the disk check a built-in gets."""
    import inspect

    assert str(inspect.signature(preflight).parameters["provider"].annotation) == "Provider"


@pytest.mark.parametrize("name", sorted(registry.BUILTINS))
def test_a_declared_network_volume_is_the_optional_interface_implemented(name):
    """``network_volume`` is declared supported exactly where the provider implements
    SupportsVolumes (dstack's ComputeWithVolumeSupport): no capability leads into another
    provider's code."""
    from lorapod.compute.provider import SupportsPriceList, SupportsVolumes

    cls = _builtin(name)
    prov = cls(api=object()) if name in ("runpod", "vast") else cls.from_kwargs(target="ssh://u@h:22")
    assert capability(prov, "network_volume").supported == isinstance(prov, SupportsVolumes)
    assert isinstance(cls, SupportsPriceList) == (name in ("runpod", "vast"))


def test_capability_reads_what_is_declared_and_refuses_the_rest_with_a_reason():
    assert capability(Newcomer(), "watchdog_api").supported
    missing = capability(Newcomer(), "network_volume")
    assert not missing.supported and "newcomer does not declare" in missing.reason
    assert capability(_builtin("runpod")(api=object()), "network_volume").supported
    assert not capability(_builtin("vast")(api=object()), "network_volume").supported
