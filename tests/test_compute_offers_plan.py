"""Offers for a run are ranked by the planner's dollars per job, not dollars per hour."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.compute.offers import choose_offers
from lorapod.compute.provider import Offer
from lorapod.errors import BudgetError
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Vastish:
    """A provider that only answers offers(); named like a real one so the planner prices it."""

    name = "vast"

    def __init__(self, offers):
        self._offers = offers

    def offers(self, req):
        return self._offers


def sdxl(**compute):
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml")
    spec.compute.max_usd = compute.get("max_usd")
    spec.compute.max_hours = compute.get("max_hours")
    return spec


def test_faster_card_wins_when_cheaper_per_job():
    # the 3090 is cheaper per hour, but the 4090 finishes the 2,000 steps so much sooner that
    # the whole job costs less on it
    offers = [Offer("vast", "slow", "RTX 3090", 0.25, 24), Offer("vast", "fast", "RTX 4090", 0.31, 24),
              Offer("vast", "odd", "Mystery GPU 9000", 0.05, 24)]
    ranked = choose_offers(sdxl(), Vastish(offers))
    assert [o.id for o in ranked] == ["fast", "slow", "odd"]  # an unknown GPU keeps its place last


def test_job_estimate_over_the_cap_is_refused_before_renting():
    offers = [Offer("vast", "a", "RTX 4090", 0.31, 24)]
    with pytest.raises(BudgetError, match=r"over the \$0\.1 cap"):
        choose_offers(sdxl(), Vastish(offers), max_usd=0.1, max_hours=0.2)
    with pytest.raises(BudgetError, match=r"over the 0\.5 h cap"):
        choose_offers(sdxl(), Vastish(offers), max_usd=100, max_hours=0.5)


def test_unknown_model_falls_back_to_hourly_price():
    spec = load_spec(raw={"model": {"id": "someone/custom-model"}, "data": {"path": "x.jsonl"}})
    offers = [Offer("vast", "b", "RTX 4090", 0.31, 24), Offer("vast", "a", "RTX 3090", 0.25, 24)]
    assert [o.id for o in choose_offers(spec, Vastish(offers))] == ["a", "b"]


def test_requirements_carry_the_planners_vram_so_small_cards_are_filtered():
    from lorapod.compute.offers import requirements, vram_needed_gb
    from lorapod.compute.provider import rank_offers

    spec = sdxl()
    need = vram_needed_gb(spec)
    req = requirements(spec)
    assert need > 6 and req.min_vram_gb == need
    small = Offer("vast", "s", "RTX 2060", 0.05, vram_gb=6)
    big = Offer("vast", "b", "RTX 4090", 0.35, vram_gb=24)
    assert rank_offers([small, big], req) == [big]
    assert requirements(spec, gpu="RTX 3070").min_vram_gb == 0  # a pinned card is the user's call


def test_offers_carry_the_estimate_for_the_default_cap():
    spec = sdxl()
    (best, *_) = choose_offers(spec, Vastish([Offer("vast", "b", "RTX 4090", 0.35, vram_gb=24)]))
    assert best.extra["plan_usd"] > 0 and best.extra["plan_hours"] > 0
