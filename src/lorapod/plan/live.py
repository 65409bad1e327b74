"""Live GPU prices from RunPod (GraphQL ``gpuTypes``) and Vast.ai (``POST /api/v0/bundles/``).

Raw HTTP for prices only, kept small and separate from the provider clients in
``lorapod.compute`` (which create and destroy instances). Keys come from RUNPOD_API_KEY and
VAST_API_KEY, travel only in the Authorization header, and are never printed. Base URLs can be
pointed elsewhere (tests use local fakes) with LORAPOD_RUNPOD_GRAPHQL_URL and LORAPOD_VAST_URL.

A failure never stops a plan: that provider falls back to the snapshot and the plan says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from lorapod.catalog.gpus import GPU, find_gpu, load_gpus
from lorapod.catalog.prices import PriceEntry, load_prices
from lorapod.errors import PlanError

RUNPOD_GRAPHQL_URL = "https://api.runpod.io/graphql"
VAST_URL = "https://console.vast.ai"
TIMEOUT_S = 15.0

GPU_TYPES_QUERY = (
    "query GpuTypes { gpuTypes { id displayName memoryInGb securePrice communityPrice "
    "secureSpotPrice communitySpotPrice lowestPrice(input: {gpuCount: 1}) "
    "{ minimumBidPrice uninterruptablePrice } } }"
)

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


def fetch_runpod(api_key: str, client: httpx.Client) -> list[PriceEntry]:
    url = os.environ.get("LORAPOD_RUNPOD_GRAPHQL_URL", RUNPOD_GRAPHQL_URL)
    r = client.post(url, json={"query": GPU_TYPES_QUERY}, headers={"Authorization": f"Bearer {api_key}"})
    r.raise_for_status()
    body = r.json()
    if body.get("errors"):
        raise ValueError("; ".join(str(e.get("message", e)) for e in body["errors"]))
    out = []
    for t in body["data"]["gpuTypes"]:
        g = match_gpu(str(t.get("displayName") or t.get("id")), t.get("memoryInGb"))
        if g is None:
            continue
        lowest = t.get("lowestPrice") or {}
        tiers = {
            "secure": t.get("securePrice"),
            "community": t.get("communityPrice"),
            "spot": lowest.get("minimumBidPrice") or t.get("communitySpotPrice"),
        }
        for tier, price in tiers.items():
            if price:
                out.append(PriceEntry("runpod", tier, g.name, float(price), source="live", offer_id=str(t.get("id"))))
    return out


def vast_request(gpus: list[GPU], disk_gb: float, limit: int = 200) -> dict:
    """The search body: verified, rentable, single-GPU on-demand offers of the GPUs asked for."""
    names = sorted({n for g in gpus for n in VAST_NAMES.get(g.name, [])})
    return {
        "limit": limit,
        "type": "ondemand",
        "verified": {"eq": True},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "num_gpus": {"in": [1]},
        "gpu_name": {"in": names},
        # Two sort keys: the contract's schema puts minItems/maxItems 2 on the list itself.
        "order": [["dph_total", "asc"], ["reliability", "desc"]],
        "allocated_storage": float(disk_gb),
    }


def fetch_vast(api_key: str, client: httpx.Client, gpus: list[GPU], disk_gb: float) -> list[PriceEntry]:
    base = os.environ.get("LORAPOD_VAST_URL", VAST_URL).rstrip("/")
    r = client.post(f"{base}/api/v0/bundles/", json=vast_request(gpus, disk_gb),
                    headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"})
    r.raise_for_status()
    offers = r.json().get("offers", [])
    if isinstance(offers, dict):
        offers = [offers]
    best: dict[str, PriceEntry] = {}
    for o in offers:
        ram = o.get("gpu_ram")
        g = match_gpu(str(o.get("gpu_name", "")), ram / 1024 if ram else None)
        if g is None or not o.get("dph_total"):
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
    try:
        return float(x) if x is not None else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def live_prices(disk_gb: float = 50, gpus: list[GPU] | None = None, timeout_s: float = TIMEOUT_S) -> LivePrices:
    """Current offers from each provider whose key is set; the snapshot for the others."""
    _, snapshot = load_prices()
    gpus = gpus or list(load_gpus()[1])
    result = LivePrices()
    fetchers = {
        "runpod": ("RUNPOD_API_KEY", lambda key, c: fetch_runpod(key, c)),
        "vast": ("VAST_API_KEY", lambda key, c: fetch_vast(key, c, gpus, disk_gb)),
    }
    with httpx.Client(timeout=timeout_s) as client:
        for provider, (env, fetch) in fetchers.items():
            key = os.environ.get(env)
            fallback = [e for e in snapshot if e.provider == provider]
            if not key:
                result.entries += fallback
                result.notes.append(f"{provider}: {env} not set, snapshot prices used")
                continue
            try:
                entries = fetch(key, client)
            except httpx.HTTPStatusError as exc:
                code = exc.response.status_code
                why = "the API key was refused" if code in (401, 403) else f"HTTP {code}"
                result.entries += fallback
                result.notes.append(f"{provider}: {why}, snapshot prices used")
                continue
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
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
