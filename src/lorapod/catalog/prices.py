"""Price snapshots: $/hour per provider, tier and GPU, and storage/bandwidth prices."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from lorapod.catalog.gpus import find_gpu
from lorapod.catalog.snapshot import Snapshot, load_data

PROVIDERS = ("runpod", "vast")


@dataclass(frozen=True)
class PriceEntry:
    """One GPU offer: a snapshot figure or a live one."""

    provider: str
    tier: str
    gpu: str
    usd_per_hour: float
    source: str = "snapshot"  # snapshot | live
    storage_per_gb_month: float | None = None  # Vast.ai: the host's rate
    download_per_gb: float | None = None  # Vast.ai: the host's inbound bandwidth rate
    upload_per_gb: float | None = None
    download_mb_s: float | None = None  # the host's measured download speed, when known
    offer_id: str | None = None
    storage_included: bool = False  # Vast.ai live offers: dph_total already covers the disk asked for
    #: an interruptible (spot) price: the planner quotes it beside the on-demand offer of the same GPU x
    #: provider, with the preemptions' expected cost (plan/spot.py), never as a plain offer
    interruptible: bool = False
    as_of: str | None = None  # the date of a figure with its own source (every interruptible one, some others)


@cache
def load_prices() -> tuple[Snapshot, tuple[PriceEntry, ...]]:
    snap, raw = load_data("prices")
    out = []
    for p in raw["prices"]:
        out.append(PriceEntry(p["provider"], p["tier"], find_gpu(p["gpu"]).name, float(p["usd_per_hour"]),
                              as_of=str(p["as_of"]) if p.get("as_of") else None))
    for p in raw.get("interruptible") or []:
        out.append(PriceEntry(p["provider"], p["tier"], find_gpu(p["gpu"]).name, float(p["usd_per_hour"]),
                              interruptible=True, as_of=str(p["as_of"])))
    return snap, tuple(out)


@cache
def load_storage() -> tuple[Snapshot, dict[str, Any]]:
    return load_data("storage")


def tier_descriptions() -> dict[str, dict[str, str]]:
    return load_data("prices")[1]["tiers"]


def runpod_volume_usd_per_gb_month() -> float:
    """RunPod's network-volume price per GB-month from the storage snapshot (billed always)."""
    _snap, st = load_storage()
    return float(st["runpod"]["network_volume"]["always"])
