"""A third provider as a third party would ship it: one class outside ``lorapod.compute``, one
``register`` call, and ``lorapod``'s own CLI behind it (``python acme_lorapod.py plan ...`` is the
console script such a package would install). lorapod ships nothing for it; everything it gets,
it gets from what its class declares (issue 47, part 4).

Its control plane is reached over HTTP at ``ACME_URL`` / ``ACME_GRAPHQL_URL`` with the account key
in ``ACME_API_KEY`` (its ``price_key_env``): in the tests that is the RunPod fake, a REST shape
like any other, driven through lorapod's RunPod client. Its name, its prices and its facts are
its own: a disk at $0.15/GB-month running and $0.05 stopped, a 30 s SIGTERM window before a
preemption's SIGKILL, the pod's own scoped variables for ``lorapod doctor``."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, ClassVar

from lorapod.catalog.billing import Billing
from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.prices import PriceEntry
from lorapod.compute import provider as registry
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

NAME = "acme"
DISK_RUNNING, DISK_STOPPED, SIGTERM_GRACE_S = 0.15, 0.05, 30.0


class AcmeProvider(ProviderBase):
    """A provider lorapod ships nothing for: its facts on its class, its HTTP through an API like
    RunPod's, its name everywhere."""

    name = NAME
    traits: ClassVar[Traits] = Traits(console_url="https://acme.example/console")
    billing: ClassVar[Billing] = Billing(disk_running_gb_month=DISK_RUNNING, disk_stopped_gb_month=DISK_STOPPED,
                                         sigterm_grace_s=SIGTERM_GRACE_S, preempted="stops",
                                         source="acme's own price page")
    doctor: ClassVar[DoctorFacts] = DoctorFacts(scoped=("RUNPOD_POD_ID", "RUNPOD_API_KEY"), spot_checks=("bid",))
    price_key_env: ClassVar[str] = "ACME_API_KEY"
    image: str | None = None

    def __init__(self, api_key: str | None = None) -> None:
        env = os.environ
        self._rp = RunPodProvider(RunPodApi(api_key or env["ACME_API_KEY"], base_url=env["ACME_URL"],
                                            graphql_url=env["ACME_GRAPHQL_URL"], backoff_s=0.05, timeout=10))
        self.image = self._rp.image

    @classmethod
    def from_kwargs(cls, **kw: Any) -> AcmeProvider:
        return cls()

    @classmethod
    def price_list(cls, api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float) -> list[PriceEntry]:
        me = cls(api_key)
        return [PriceEntry(NAME, "spot" if o.interruptible else "ondemand", find_gpu(o.gpu_name).name,
                           o.usd_per_hour, source="live", interruptible=o.interruptible, offer_id=o.id)
                for o in me.offers(Requirements()) + me.offers(Requirements(interruptible=True))]

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


def register() -> None:
    """What the plugin's package does on import: one call, its class."""
    registry.register(NAME, AcmeProvider)


if __name__ == "__main__":  # the plugin's console script: lorapod's CLI, with acme registered
    import importlib.util

    import lorapod.cli.main as cli

    register()
    cli.COMMANDS = [c for c in cli.COMMANDS if importlib.util.find_spec("lorapod.cli." + c)]
    cli.main()
