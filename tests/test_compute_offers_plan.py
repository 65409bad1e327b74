"""Offers for a run are ranked by the planner's dollars per job, not dollars per hour."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod.compute.offers import OfferEstimate, RankedOffer, choose_offers, planned_job
from lorapod.compute.provider import Offer, Traits
from lorapod.errors import BudgetError
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Vastish:
    """A provider that only answers offers(). Its name is no one the catalog prices: the planner
    ranks offers by their GPU (catalog data), never by the provider's name."""

    name = "newcomer"

    def __init__(self, offers):
        self._offers = offers

    def offers(self, req):
        return self._offers


def _choose(spec, provider, **kw) -> list[Offer]:
    return [r.offer for r in choose_offers(spec, provider, job=planned_job(spec), **kw)]


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
    ranked = choose_offers(sdxl(), Vastish(offers), job=planned_job(sdxl()))
    assert [r.offer.id for r in ranked] == ["fast", "slow", "odd"]  # an unknown GPU keeps its place last
    # the two catalog GPUs carry an estimate (so a default $ cap), the unknown one none
    assert [r.estimate is not None for r in ranked] == [True, True, False]


def test_job_estimate_over_the_cap_is_refused_before_renting():
    offers = [Offer("vast", "a", "RTX 4090", 0.31, 24)]
    with pytest.raises(BudgetError, match=r"over the \$0\.1 cap"):
        _choose(sdxl(), Vastish(offers), max_usd=0.1, max_hours=0.2)
    with pytest.raises(BudgetError, match=r"over the 0\.5 h cap"):
        _choose(sdxl(), Vastish(offers), max_usd=100, max_hours=0.5)


def test_unknown_model_falls_back_to_hourly_price():
    spec = load_spec(raw={"model": {"id": "someone/custom-model"}, "data": {"path": "x.jsonl"}})
    offers = [Offer("vast", "b", "RTX 4090", 0.31, 24), Offer("vast", "a", "RTX 3090", 0.25, 24)]
    assert planned_job(spec) is None
    assert [o.id for o in _choose(spec, Vastish(offers))] == ["a", "b"]


def test_requirements_carry_the_planners_vram_so_small_cards_are_filtered():
    from lorapod.compute.offers import requirements
    from lorapod.compute.provider import rank_offers

    spec = sdxl()
    job = planned_job(spec)
    need = round(job.estimate.peak_gb, 1)
    req = requirements(spec, job=job)
    assert need > 6 and req.min_vram_gb == need
    small = Offer("vast", "s", "RTX 2060", 0.05, vram_gb=6)
    big = Offer("vast", "b", "RTX 4090", 0.35, vram_gb=24)
    assert rank_offers([small, big], req) == [big]
    assert requirements(spec, gpu="RTX 3070", job=job).min_vram_gb == 0  # a pinned card is the user's call


def test_offers_carry_the_estimate_as_a_value_not_in_the_providers_extra():
    spec = sdxl()
    offer = Offer("newcomer", "b", "RTX 4090", 0.35, vram_gb=24, extra={"k": 1})
    (best,) = choose_offers(spec, Vastish([offer]), job=planned_job(spec))
    assert isinstance(best, RankedOffer) and isinstance(best.estimate, OfferEstimate)
    assert best.estimate.usd_total > 0 and best.estimate.hours_total > 0 and best.estimate.pull_gb > 0
    assert best.offer == offer  # nothing planner-made in the provider's free-form dict


def test_the_default_cap_and_the_pull_guard_read_the_leases_estimate(tmp_path):
    """provision's default cap is twice the estimate on the Lease; the pull guard's bound comes
    from its pull_gb. A provider no catalog names (a plugin) gets them too."""
    from lorapod.compute.acquire import Lease
    from lorapod.compute.context import JobContext, RunOptions
    from lorapod.compute.provider import Instance
    from lorapod.compute.provision import _effective_caps
    from lorapod.rundir import RunDir
    from lorapod.store.ledger import Ledger

    est = OfferEstimate(1.5, 2.0, 0.25)
    inst = Instance("i", "newcomer", "running")
    lease = Lease("l", "i", inst, Offer("newcomer", "o", "RTX 4090", 0.35), "lab", None, None, 0.0, est)
    ctx = JobContext(sdxl(), Vastish([]), "newcomer", RunOptions(), Ledger(), RunDir.create(tmp_path, "j"), "j")
    usd, hours, note = _effective_caps(ctx, lease)
    assert (usd, hours) == (3.0, 4.0) and "twice the planner's estimate" in note
    bare = Lease("l", "i", inst, Offer("newcomer", "o", "?", 0.35), "lab", None, None, 0.0)
    assert _effective_caps(ctx, bare)[:2] == (None, RunOptions().default_cap_hours)


class Plugin:
    """A plugin provider (registered as a class, as a built-in is): rents (the default traits),
    offers one catalog GPU, mounts volumes (SupportsVolumes), and has no capacity to create."""

    name = "plugin_planned"
    image = None
    attached: list = []
    traits = Traits()

    @classmethod
    def from_kwargs(cls, **kw):
        return cls()

    def capabilities(self):
        return []

    def offers(self, req):
        return [Offer(self.name, "a", "RTX 4090", 0.35, vram_gb=24)]

    def create(self, offer, spec):
        from lorapod.compute.provider import NoCapacity

        raise NoCapacity("no capacity in the test")

    def list_instances(self):
        return []

    def attach_volume(self, spec, name, job=None, gpu=None, max_usd=None, max_hours=None, say=print):
        self.attached.append([r.estimate for r in choose_offers(spec, self, gpu, max_usd, max_hours, job=job)])
        return name


def test_one_run_reads_its_data_once(tmp_path, monkeypatch):
    """prepare_run plans the job once: preflight's disk check, the volume attach and the acquire
    stage's ranking all read that one job, so the data is counted once per run (it was read three
    times, in three rooms)."""
    import lorapod.plan.job as plan_job_module
    from lorapod.compute import provider as registry
    from lorapod.compute.acquire import acquire
    from lorapod.compute.prepare import RunFlags, prepare_run
    from lorapod.compute.session import Session
    from lorapod.errors import ProviderError

    from .remote_helpers import make_spec

    reads = []
    count = plan_job_module._count_examples
    monkeypatch.setattr(plan_job_module, "_count_examples", lambda paths: reads.append(paths) or count(paths))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(Plugin.name, Plugin)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = make_spec(tmp_path, model="Qwen/Qwen2.5-0.5B", disk_gb=100, volume="cache")
    prepared = prepare_run(path, Plugin.name, RunFlags(deps="none"), say=lambda m: None, note=lambda m: None)
    assert prepared.job is not None and len(reads) == 1
    assert Plugin.attached and Plugin.attached[-1][0] is not None  # the volume saw the run's estimate
    session = Session(prepared.spec, prepared.provider, prepared.target, prepared.options, prepared.ledger,
                      say=lambda m: None, job=prepared.job)
    with pytest.raises(ProviderError, match="no capacity in the test"):
        acquire(session.ctx)
    assert len(reads) == 1
