"""docs/architecture.md's "To add a provider" checklist is kept by the code (issue 47, part 5): every
name it gives resolves, it names every part of the provider contract, and every built-in provider
declares what it says a provider declares."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from lorapod.catalog.billing import Billing
from lorapod.compute import provider as registry
from lorapod.compute.provider import DoctorFacts, Provider, ProviderBase, capability

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## To add a provider")
    end = text.find("\n## ", start + 5)
    return text[start:] if end < 0 else text[start:end]


def test_every_name_the_checklist_gives_exists():
    anchors = re.findall(r"`(lorapod(?:\.\w+)+):(\w+)`", section())
    assert len(anchors) >= 15, anchors
    for module, name in anchors:
        assert hasattr(importlib.import_module(module), name), f"{module}:{name} named in the checklist does not exist"


def test_the_checklist_names_every_part_of_the_provider_contract():
    text = section()
    members = {n for n in dir(Provider) if not n.startswith("_")} | set(Provider.__annotations__)
    members |= {n for n, v in vars(ProviderBase).items() if not n.startswith("_")} | set(ProviderBase.__annotations__)
    members |= {"from_kwargs"}
    missing = sorted(m for m in members if f"`{m}`" not in text and f"`{m}(" not in text)
    assert not missing, f"the provider checklist in docs/architecture.md does not name {missing}"


def test_every_builtin_declares_what_the_checklist_says(monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "k")
    monkeypatch.setenv("VAST_API_KEY", "k")
    text = section()
    for name in registry.BUILTINS:
        cls = registry.provider_class(name)
        assert isinstance(cls.billing, Billing), f"{name} declares no Billing"
        if cls.traits.borrowed:
            continue
        assert isinstance(cls.doctor, DoctorFacts) and cls.doctor.scoped, f"{name} declares no doctor facts"
        prov = registry.get(name)
        declared = {c.name for c in prov.capabilities()}
        assert not sorted(c for c in declared if f"`{c}`" not in text), f"{name}: a capability the checklist omits"
        assert capability(prov, "deadman").supported and capability(prov, "watchdog_api").supported
        recipe = prov.api.self_destroy_recipe("")  # api.py's recipe: the watchdog and the switch run it
        assert recipe["steps"], name


@pytest.mark.parametrize("word", ["billing", "doctor", "deadman", "register", "BUILTINS"])
def test_the_checklist_still_says(word):
    assert word in section()
