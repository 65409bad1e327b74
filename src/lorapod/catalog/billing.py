"""How a provider bills what is not the GPU hour, and what its spot tier does: one value per
provider, declared on its own class, read by the planner without a single provider name.

The planner (plan/cost.py, plan/spot.py) sits below compute and never imports a provider, so the
facts reach it as data, the way live prices do: each provider class declares its
:class:`Billing` (``billing`` beside its ``traits``), the provider registry
(``lorapod.compute.provider``) registers it here when the class is loaded or a plugin registers,
and every :class:`~lorapod.catalog.prices.PriceEntry` of that provider is priced by it. A provider
the planner has no facts for is said as such in the plan's warnings, never priced as if its disk
were free (a plugin used to get no storage charge at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Billing:
    """A provider's billing facts, each with the source its class cites."""

    #: $/GB-month of the instance's disk while it runs; None when the offer carries the host's own
    #: rate (``disk_rate_per_offer``) or the hourly price covers it (``PriceEntry.storage_included``)
    disk_running_gb_month: float | None = None
    #: $/GB-month of a stopped or paused instance's disk (a preempted husk); None: the offer's rate
    disk_stopped_gb_month: float | None = None
    #: each host sets its own disk rate (the offer's ``storage_per_gb_month``)
    disk_rate_per_offer: bool = False
    #: bandwidth is billed per GB at the offer's rates, apart from the hourly price
    bandwidth_per_gb: bool = False
    #: spot: seconds between a preemption's SIGTERM and its SIGKILL (None: no signal documented)
    sigterm_grace_s: float | None = None
    #: spot: a preempted instance is stopped (destroyed once noticed) or paused (waited for, since it
    #: may resume when its bid wins again, for ``resume_wait_min``)
    preempted: Literal["stops", "pauses"] = "stops"
    resume_wait_min: float = 0.0
    source: str = ""

    def disk_usd_per_hour(self, disk_gb: float, offer_rate: float | None, stopped: bool = False) -> float | None:
        """What ``disk_gb`` of disk costs an hour, running or ``stopped``; None when unknown (a
        per-host rate the offer does not carry)."""
        if self.disk_rate_per_offer:
            rate = offer_rate
        elif stopped and self.disk_stopped_gb_month is not None:
            rate = self.disk_stopped_gb_month
        else:
            rate = self.disk_running_gb_month
        return None if rate is None else disk_gb * float(rate) / HOURS_PER_MONTH


_BY_PROVIDER: dict[str, Billing] = {}


def register_billing(provider: str, billing: Billing) -> None:
    """The facts of ``provider`` (the registry calls this for every class it loads or registers)."""
    if not isinstance(billing, Billing):
        raise TypeError(f"provider {provider!r} declares billing {billing!r}, not a catalog.billing.Billing")
    _BY_PROVIDER[provider] = billing


def billing_for(provider: str) -> Billing | None:
    """The registered facts of ``provider``; None when none are known here."""
    return _BY_PROVIDER.get(provider)
