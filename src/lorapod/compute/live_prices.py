"""Live GPU prices from RunPod (GraphQL ``gpuTypes``) and Vast.ai (``POST /api/v0/bundles/``).

Through the same API classes the runner uses (``lorapod.compute.runpod.api``,
``lorapod.compute.vast.api``) and the same offer filters: RunPod types in stock only, and Vast's
search built by :func:`lorapod.compute.vast.provider.offer_query`, so ``lorapod plan --live``
prices the offers ``lorapod run`` would rent (hosts that can start the default image, reliable,
direct SSH, the job's disk in ``dph_total``). Keys come from RUNPOD_API_KEY and VAST_API_KEY,
travel only in the Authorization header, and are never printed. Base URLs can be pointed
elsewhere (tests use local fakes) with LORAPOD_RUNPOD_GRAPHQL_URL and LORAPOD_VAST_URL.

A failure never stops a plan: that provider falls back to the snapshot and the plan says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from lorapod.catalog.gpus import GPU, find_gpu, load_gpus
from lorapod.catalog.prices import PriceEntry, load_prices
from lorapod.errors import LorapodError, PlanError

TIMEOUT_S = 15.0

# Vast.ai's gpu_name for each catalog GPU (40 GB and 80 GB A100s share names; gpu_ram tells them apart).
VAST_NAMES = {
    "RTX 3090": ["RTX 3090"],
    "RTX 4090": ["RTX 4090"],
    "RTX 5090": ["RTX 5090"],
    "RTX A6000": ["RTX A6000"],
    "A40": ["A40"],
    "L4": ["L4"],
    "L40S": ["L40S"],
    "A100 40GB": ["A100 PCIE", "A100 SXM4"],
    "A100 80GB": ["A100 PCIE", "A100 SXM4", "A100X"],
    "H100 PCIe": ["H100 PCIE", "H100 NVL"],
    "H100 SXM": ["H100 SXM"],
    "H200": ["H200", "H200 NVL"],
}


@dataclass
class LivePrices:
    entries: list[PriceEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was refreshed, what fell back and why


def match_gpu(name: str, vram_gb: float | None = None) -> GPU | None:
    """A provider's GPU name (+ memory) to a catalog GPU, or None when the catalog lacks it."""
    try:
        g = find_gpu(name)
    except PlanError:
        g = None
        low = name.lower()
        _, gpus = load_gpus()
        for cand in gpus:
            if cand.name.split()[0].lower() in low.split() or cand.name.split()[0].lower() in low.replace("-", " ").split():
                g = cand
                break
    if g is not None and vram_gb and abs(g.vram_gb - vram_gb) > 0.15 * g.vram_gb:
        _, gpus = load_gpus()
        prefix = g.name.split()[0]
        same = [c for c in gpus if c.name.split()[0] == prefix and abs(c.vram_gb - vram_gb) <= 0.15 * c.vram_gb]
        g = same[0] if same else None
    return g


def fetch_runpod(api_key: str, timeout_s: float = TIMEOUT_S) -> list[PriceEntry]:
    from lorapod.compute.runpod.api import RunPodApi
    from lorapod.compute.runpod.provider import in_stock

    api = RunPodApi(api_key, retries=1, backoff_s=0.2, timeout=timeout_s)
    try:
        types = api.gpu_types()
    finally:
        api.close()
    out = []
    for t in types:
        if not isinstance(t, dict) or not in_stock(t):  # listed is not rentable (compute/runpod/provider.py)
            continue
        g = match_gpu(str(t.get("displayName") or t.get("id")), _num(t.get("memoryInGb")))
        if g is None:
            continue
        lowest = t.get("lowestPrice") or {}
        tiers = {
            "secure": t.get("securePrice"),
            "community": t.get("communityPrice"),
            "spot": lowest.get("minimumBidPrice") or t.get("communitySpotPrice"),
        }
        for tier, price in tiers.items():
            if _num(price):
                out.append(PriceEntry("runpod", tier, g.name, float(price), source="live", offer_id=str(t.get("id")),
                                      interruptible=tier == "spot"))  # priced as spot quotes (plan/spot.py)
    return out


def vast_request(gpus: list[GPU], disk_gb: float, limit: int = 200) -> dict:
    """The search body: the runner's own query (single-GPU, the default image's hosts), for the
    GPUs asked for."""
    from lorapod.catalog.images import DEFAULTS
    from lorapod.compute.provider import Requirements
    from lorapod.compute.vast.provider import offer_query

    names = sorted({n for g in gpus for n in VAST_NAMES.get(g.name, [])})
    return offer_query(Requirements(disk_gb=float(disk_gb), gpu_count=1), DEFAULTS["vast"], limit=limit,
                       gpu_names=names)


def fetch_vast(api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float = TIMEOUT_S) -> list[PriceEntry]:
    from lorapod.compute.vast.api import VastApi

    api = VastApi(api_key, retries=1, backoff_s=0.2, timeout=timeout_s)
    try:
        offers = api.search_offers(vast_request(gpus, disk_gb))
    finally:
        api.close()
    best: dict[str, PriceEntry] = {}
    for o in offers:
        if not isinstance(o, dict):
            continue
        ram = _num(o.get("gpu_ram"))
        g = match_gpu(str(o.get("gpu_name", "")), ram / 1000 if ram else None)  # MB, as vast.py counts
        if g is None or not _num(o.get("dph_total")):
            continue
        e = PriceEntry(
            "vast", "ondemand", g.name, float(o["dph_total"]), source="live",
            storage_per_gb_month=_num(o.get("storage_cost")),
            download_per_gb=_num(o.get("inet_down_cost")),
            upload_per_gb=_num(o.get("inet_up_cost")),
            offer_id=str(o.get("id")),
            storage_included=True,
        )
        if g.name not in best or e.usd_per_hour < best[g.name].usd_per_hour:
            best[g.name] = e
    return list(best.values())


def _num(x: object) -> float | None:
    """A number a provider sent, or None (a bool, NaN, a negative or a string is not a price)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if x == x and x >= 0 else None


def live_prices(disk_gb: float = 50, gpus: list[GPU] | None = None, timeout_s: float = TIMEOUT_S) -> LivePrices:
    """Current offers from each provider whose key is set; the snapshot for the others."""
    _, snapshot = load_prices()
    gpus = gpus or list(load_gpus()[1])
    result = LivePrices()
    fetchers = {
        "runpod": ("RUNPOD_API_KEY", lambda key: fetch_runpod(key, timeout_s)),
        "vast": ("VAST_API_KEY", lambda key: fetch_vast(key, gpus, disk_gb, timeout_s)),
    }
    from lorapod.compute.httpapi import ApiError

    for provider, (env, fetch) in fetchers.items():
        key = os.environ.get(env)
        fallback = [e for e in snapshot if e.provider == provider]
        if not key:
            result.entries += fallback
            result.notes.append(f"{provider}: {env} not set, snapshot prices used")
            continue
        try:
            entries = fetch(key)
        except ApiError as exc:
            why = ("the API key was refused" if exc.status in (401, 403) or "refused the API key" in exc.message
                   else f"HTTP {exc.status}" if exc.status else f"live prices unavailable ({type(exc).__name__})")
            result.entries += fallback
            result.notes.append(f"{provider}: {why}, snapshot prices used")
            continue
        except (LorapodError, ValueError, KeyError, TypeError) as exc:
            result.entries += fallback
            result.notes.append(f"{provider}: live prices unavailable ({type(exc).__name__}), snapshot prices used")
            continue
        if not entries:
            result.entries += fallback
            result.notes.append(f"{provider}: no matching offers, snapshot prices used")
            continue
        result.entries += entries
        result.notes.append(f"{provider}: {len(entries)} live prices")
    return result
