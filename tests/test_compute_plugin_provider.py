"""A third provider, built only here and registered as a plugin (``register(name, cls)``), gets
everything a built-in gets (issue 47, part 4): the planner prices its disk, its bandwidth and its
spot tier's preemptions by the facts its class declares (catalog/billing.py ``Billing``; the
planner never reads a provider's name), ``lorapod doctor`` checks its instances by its class's
``DoctorFacts``, and its offers' spot fields are typed. Its control plane is the RunPod fake (a
REST shape like any other), but its name, prices and facts are its own: a disk at $0.15/GB-month
running and $0.05 stopped, a 30 s SIGTERM window before a preemption's SIGKILL."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import pytest

from lorapod.catalog.billing import Billing, billing_for
from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.prices import PriceEntry
from lorapod.compute import provider as registry
from lorapod.compute.doctor import cheapest_offer, doctor_note, run_doctor
from lorapod.compute.offers import choose_offers, planned_job
from lorapod.compute.provider import (
    Capability,
    DoctorFacts,
    Instance,
    InstanceSpec,
    Offer,
    ProviderBase,
    Requirements,
    Traits,
)
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.plan.choose import plan_job
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .remote_helpers import make_spec

NAME = "acme"


class AcmeProvider(ProviderBase):
    """A provider lorapod ships nothing for: its facts on its class, its HTTP through an API like
    RunPod's (the fake), its name everywhere."""

    name = NAME
    traits: ClassVar[Traits] = Traits(console_url="https://acme.example/console")
    billing: ClassVar[Billing] = Billing(disk_running_gb_month=0.15, disk_stopped_gb_month=0.05,
                                         sigterm_grace_s=30.0, preempted="stops", source="acme's own price page")
    doctor: ClassVar[DoctorFacts] = DoctorFacts(scoped=("RUNPOD_POD_ID", "RUNPOD_API_KEY"), spot_checks=("bid",))
    price_key_env: ClassVar[str] = "ACME_API_KEY"
    fake: ClassVar[Any] = None  # the control plane, set by the test

    def __init__(self) -> None:
        f = self.fake
        self._rp = RunPodProvider(RunPodApi(f.account_key, base_url=f.url, graphql_url=f.graphql_url,
                                            backoff_s=0.05, timeout=10))

    @classmethod
    def from_kwargs(cls, **kw: Any) -> AcmeProvider:
        return cls()

    @classmethod
    def price_list(cls, api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float) -> list[PriceEntry]:
        out = []
        for o in cls().offers(Requirements()) + cls().offers(Requirements(interruptible=True)):
            out.append(PriceEntry(NAME, "spot" if o.interruptible else "ondemand", find_gpu(o.gpu_name).name,
                                  o.usd_per_hour, source="live", interruptible=o.interruptible, offer_id=o.id))
        return out

    def capabilities(self) -> list[Capability]:
        return [Capability("destroy", True, "DELETE"), Capability("watchdog_api", True, "its scoped key"),
                Capability("spot", True, "a bid"), Capability("deadman", True, "its start command")]

    def offers(self, req: Requirements) -> list[Offer]:
        return [replace(o, provider=NAME) for o in self._rp.offers(req)]

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        return self._rp.create(replace(offer, provider="runpod"), spec).with_(provider=NAME)

    def refresh(self, inst: Instance) -> Instance:
        return self._rp.refresh(inst).with_(provider=NAME)

    def destroy(self, instance_id: str) -> None:
        self._rp.destroy(instance_id)

    def list_instances(self) -> list[Instance]:
        return [i.with_(provider=NAME) for i in self._rp.list_instances()]

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {**self._rp.watchdog_config(inst), "provider": NAME}


@pytest.fixture
def acme(runpod):
    from lorapod.catalog import billing

    AcmeProvider.fake = runpod
    registry.register(NAME, AcmeProvider)
    try:
        yield AcmeProvider()
    finally:  # a registration lives for the process: the next test starts without it
        registry._REGISTRY.pop(NAME, None)
        billing._BY_PROVIDER.pop(NAME, None)


def test_registering_a_plugin_teaches_the_planner_its_billing(acme):
    assert billing_for(NAME) is AcmeProvider.billing
    assert NAME in registry.on_hint() and registry.doctor_facts(NAME) is AcmeProvider.doctor


def test_its_estimates_charge_its_disk_and_its_spot_quotes_use_its_sigterm_window(acme, tmp_path):
    spec = load_spec(make_spec(tmp_path, model="Qwen/Qwen2.5-0.5B", disk_gb=20, spot="auto"))
    prices = AcmeProvider.price_list("key", [], 20, 10)
    plan = plan_job(spec, provider=NAME, prices=prices)
    opt = plan.best
    assert opt is not None and opt.provider == NAME
    storage = [p for p in opt.phases if p.name.startswith("storage")]
    assert storage and storage[0].usd == pytest.approx(20 * 0.15 / 730 * sum(p.hours for p in opt.phases), rel=1e-6)
    assert not any("unknown to the planner" in w for w in plan.warnings + opt.warnings)
    spot = next(o.spot for o in plan.options if o.spot is not None)
    assert spot.grace_s == 30.0  # its own window: a save of a few seconds fits it
    # the run's own estimate of each of its offers (compute/offers.py) charges the disk too
    ranked = choose_offers(spec, acme, None, None, None, job=planned_job(spec))
    assert ranked and ranked[0].estimate is not None
    no_disk = replace(AcmeProvider.billing, disk_running_gb_month=0.0)
    from lorapod.catalog.billing import register_billing

    register_billing(NAME, no_disk)
    cheaper = choose_offers(spec, acme, None, None, None, job=planned_job(spec))
    register_billing(NAME, AcmeProvider.billing)
    assert ranked[0].estimate.usd_total > cheaper[0].estimate.usd_total


def test_its_spot_offers_carry_typed_fields(acme):
    offers = acme.offers(Requirements(interruptible=True))
    assert offers and all(o.interruptible and o.bid_per_gpu_hour and o.spot_tier for o in offers)


def test_doctor_checks_its_instance_by_its_own_facts(acme, runpod):
    ledger = Ledger()
    assert "never passed `lorapod doctor acme`" in (doctor_note(ledger, NAME) or "")
    report = run_doctor(acme, cheapest_offer(acme), ledger, say=lambda m: None, poll_s=0.2)
    checks = {c.name: c for c in report.checks}
    assert report.passed, [(c.name, c.evidence) for c in report.checks]
    assert "RUNPOD_API_KEY" in checks["scoped key"].evidence and checks["dead man's switch"].ok
    assert all(i.deleted_by == "pod-scoped key" for i in runpod.instances.values())
    assert doctor_note(ledger, NAME) is None  # passed: remembered like a built-in's
