"""compute/offers.py and provider.rank_offers: which offers a run asks for, cheapest first, and why none fits."""

from __future__ import annotations

import pytest

from lorapod.compute.offers import choose_offers as choose
from lorapod.compute.provider import Offer, Requirements, rank_offers
from lorapod.errors import PlanError
from lorapod.spec import load_spec


def choose_offers(spec, provider, **kw) -> list[Offer]:
    return [r.offer for r in choose(spec, provider, job=None, **kw)]


class OffersOnly:
    name = "fakeprov"

    def __init__(self, offers):
        self._offers = offers

    def offers(self, req):
        return self._offers


OFFERS = [Offer("p", "a", "RTX 4090", 0.69, 24), Offer("p", "b", "RTX 3090", 0.22, 24),
          Offer("p", "c", "A100 80GB", 1.19, 80), Offer("p", "d", "RTX 3090", 0.30, 24, reliability=0.99)]


def test_rank_offers_filters_and_sorts_by_price():
    assert [o.id for o in rank_offers(OFFERS, Requirements())] == ["b", "d", "a", "c"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(gpu="rtx 3090"))] == ["b", "d"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(min_vram_gb=40))] == ["c"]
    assert [o.id for o in rank_offers(OFFERS, Requirements(max_usd_per_hour=0.5))] == ["b", "d"]


def test_choose_offers_explains_empty_results(tmp_path):
    spec = load_spec(raw={"model": {"id": "m"}, "data": {"path": "x"}, "compute": {"max_usd": 1, "max_hours": 10}})
    with pytest.raises(PlanError, match=r"no fakeprov offer costs under \$0.100/h") as exc:
        choose_offers(spec, OffersOnly(OFFERS))
    assert "--max-usd" in exc.value.hint
    with pytest.raises(PlanError, match=r"fakeprov has no offer for GPU .H100."):
        choose_offers(spec, OffersOnly(OFFERS), gpu="H100", max_usd=100)
    assert [o.id for o in choose_offers(spec, OffersOnly(OFFERS), max_usd=5)] == ["b", "d"]
