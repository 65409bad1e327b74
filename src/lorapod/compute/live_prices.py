"""Live GPU prices from every provider that reads a price list (RunPod: GraphQL ``gpuTypes``;
Vast.ai: ``POST /api/v0/bundles/``).

Each provider reads its own (:class:`~lorapod.compute.provider.SupportsPriceList`, implemented in
its package) through the same API class and offer filters its runner uses: RunPod types in stock
only, and Vast's search built by :func:`lorapod.compute.vast.provider.offer_query`, so ``lorapod plan --live``
prices the offers ``lorapod run`` would rent (hosts that can start the default image, reliable,
direct SSH, the job's disk in ``dph_total``). Keys come from each provider's ``price_key_env`` (RUNPOD_API_KEY, VAST_API_KEY),
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


@dataclass
class LivePrices:
    entries: list[PriceEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was refreshed, what fell back and why
    refreshed: list[str] = field(default_factory=list)  # the providers whose prices are live
    keys_missing: list[str] = field(default_factory=list)  # the key variables not set

    def headline(self, snapshot_note: str) -> str:
        """One line, said before the table: whether any price is live, and why not."""
        if self.refreshed:
            return "--live: " + "; ".join(n.removesuffix(", snapshot prices used") for n in self.notes)
        why = (f"{' and '.join(self.keys_missing)} not set" if len(self.keys_missing) == len(self.notes)
               else "; ".join(n.removesuffix(", snapshot prices used") for n in self.notes) or "no provider lists prices")
        return f"--live: {why}: offline {snapshot_note}"


def match_gpu(name: str, vram_gb: float | None = None) -> GPU | None:
    """A provider's GPU name (+ memory) to a catalog GPU, or None when the catalog lacks it."""
    try:
        g = find_gpu(name, vram_gb)
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


def num(x: object) -> float | None:
    """A number a provider sent, or None (a bool, NaN, a negative or a string is not a price)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if x == x and x >= 0 else None


def live_prices(disk_gb: float = 50, gpus: list[GPU] | None = None, timeout_s: float = TIMEOUT_S) -> LivePrices:
    """Current offers from each registered provider that reads a price list
    (:class:`~lorapod.compute.provider.SupportsPriceList`) and whose key is set; the snapshot for
    the others."""
    from lorapod.compute import provider as registry
    from lorapod.compute.httpapi import ApiError

    _, snapshot = load_prices()
    gpus = gpus or list(load_gpus()[1])
    result = LivePrices()
    for provider in registry.names():
        try:
            cls = registry.provider_class(provider)
        except (ImportError, LorapodError):
            continue
        if not isinstance(cls, registry.SupportsPriceList):
            continue
        env = cls.price_key_env
        key = os.environ.get(env)
        fallback = [e for e in snapshot if e.provider == provider]
        if not key:
            result.entries += fallback
            result.keys_missing.append(env)
            result.notes.append(f"{provider}: {env} not set, snapshot prices used")
            continue
        try:
            entries = cls.price_list(key, gpus, disk_gb, timeout_s)
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
        result.refreshed.append(provider)
        result.notes.append(f"{provider}: {len(entries)} live prices")
    return result
