"""The planner's spot tier (plan/spot.py): the expected cost of a job on interruptible GPUs,
preemptions included, the rate's prior and its update from the ledger, Young's interval, and the
choice between the tiers (``compute.spot``)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from lorapod.errors import SpecError
from lorapod.plan.choose import plan_job
from lorapod.plan.spot import (
    SpotJob,
    decide,
    expected,
    preemption_rate,
    segments,
    spot_job,
    state_mb,
    young_interval,
)
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SDXL = EXAMPLES / "sdxl-object-lora.yaml"


@pytest.fixture(autouse=True)
def _home(monkeypatch, tmp_path):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))  # no ledger: the prior alone


# -- the closed form, by hand

JOB = SpotJob(setup=0.2, work=1.0, tail=0.0, resetup=0.2, checkpoint=0.0, wait=0.1, husk=0.05,
              usd_per_hour=0.5, storage_usd_per_hour=0.01, husk_usd_per_hour=0.02, per_setup_usd=0.03)


def test_expected_hours_dollars_and_preemptions_by_hand():
    # rate 0.5/h, checkpoints every 0.5 h of training: two stretches of 0.5 h.
    # first setup: (1/0.5 + 0.1)(e^0.1 - 1) = 2.1 x 0.105171 = 0.220859 h, 0.105171 preemptions
    # a recovery: 0.1 + 2.1 x 0.105171 = 0.320859 h
    # a stretch: (e^0.25 - 1)(2 + 0.320859) = 0.284025 x 2.320859 = 0.659183 h
    # hours: 0.220859 + 2 x 0.659183 = 1.539225
    # preemptions: 0.105171 + 2 x 0.284025 x e^0.1 (1.105171) = 0.732964
    # billed: 1.539225 - 0.732964 x 0.1 = 1.465928
    # $: 1.465928 x (0.5 + 0.01) + 0.732964 x 0.05 x 0.02 + (1 + 0.732964) x 0.03 = 0.800345
    out = expected(JOB, 0.5, 0.5)
    assert out.hours == pytest.approx(1.539225, abs=2e-6)
    assert out.preemptions == pytest.approx(0.732964, abs=2e-6)
    assert out.billed_hours == pytest.approx(1.465928, abs=2e-6)
    assert out.usd == pytest.approx(0.800345, abs=2e-6)
    assert out.checkpoints == 2


def test_no_preemptions_is_the_plain_sum():
    out = expected(JOB, 0.0, 0.5)
    assert out.hours == pytest.approx(1.2) and out.billed_hours == pytest.approx(1.2) and out.preemptions == 0
    assert out.usd == pytest.approx(1.2 * 0.51 + 0.03)


def test_a_checkpoint_costs_its_stall_in_every_stretch():
    ckpt = SpotJob(**{**JOB.__dict__, "checkpoint": 0.01})
    assert expected(ckpt, 0.0, 0.25).hours == pytest.approx(1.2 + 4 * 0.01)
    assert segments(1.0, 0.3) == pytest.approx([0.3, 0.3, 0.3, 0.1])
    assert segments(1.0, math.inf) == [1.0]


def test_young_interval():
    # sqrt(2 x 0.01 h x 2 h) = 0.2 h
    assert young_interval(0.01, 0.5) == pytest.approx(0.2)
    assert young_interval(0.01, 0.0) == math.inf


def test_more_preemptions_cost_more():
    a, b = expected(JOB, 0.1, 0.5), expected(JOB, 1.0, 0.5)
    assert b.usd > a.usd and b.hours > a.hours and b.preemptions > a.preemptions


# -- the rate: prior, then the ledger

def test_the_prior_and_its_range():
    r = preemption_rate()
    assert r.per_hour == pytest.approx(0.1)
    # shape 1: an exponential, quantiles -ln(1 - q) / 10
    assert r.low == pytest.approx(-math.log(0.9) / 10, rel=1e-6)
    assert r.high == pytest.approx(math.log(10) / 10, rel=1e-6)
    assert "prior 0.1/h" in r.basis
    assert preemption_rate(0.5).per_hour == pytest.approx(0.5)


def test_measurements_update_the_prior():
    # 3 preemptions in 20 h with the prior 0.1/h: shape 1 + 3, rate 10 + 20 -> mean 4 / 30
    r = preemption_rate(0.1, events=3, hours=20.0)
    assert r.per_hour == pytest.approx(4 / 30)

    def cdf(x: float) -> float:  # Erlang(4, 30), written out
        z = 30 * x
        return 1 - math.exp(-z) * (1 + z + z**2 / 2 + z**3 / 6)

    assert cdf(r.low) == pytest.approx(0.1, abs=1e-6) and cdf(r.high) == pytest.approx(0.9, abs=1e-6)
    # many measured hours replace the prior: 50 preemptions in 500 h -> about 0.1 whatever the prior
    assert preemption_rate(2.0, events=50, hours=500.0).per_hour == pytest.approx(51 / 500.5)
    assert "3 preemption(s) in 20.0 h" in r.basis


def test_the_plan_reads_the_rate_from_the_ledger(tmp_path):
    from lorapod.home import lorapod_home
    from lorapod.store.ledger import Ledger
    from lorapod.store.preemptions import record_spot_instance

    spec = load_spec(SDXL, ["compute.spot=auto"])
    before = next(o for o in plan_job(spec, images=25).options if o.provider == "vast" and o.gpu == "RTX 4090")
    lorapod_home().mkdir(parents=True, exist_ok=True)
    ledger = Ledger(lorapod_home() / "ledger.db")
    for hours, preempted in ((5.0, True), (3.0, True), (2.0, False)):
        record_spot_instance(ledger, "job1", provider="vast", gpu="RTX 4090", tier="min_bid", hours=hours,
                             preempted=preempted)
    record_spot_instance(ledger, "job2", provider="runpod", gpu="RTX 4090", tier="spot", hours=9.0, preempted=True)
    ledger.flush(5)
    ledger.close()
    after = next(o for o in plan_job(spec, images=25).options if o.provider == "vast" and o.gpu == "RTX 4090")
    # 2 preemptions in 10 h on vast RTX 4090 min_bid (the runpod instance is another provider)
    assert after.spot.rate.events == 2 and after.spot.rate.hours == pytest.approx(10.0)
    assert after.spot.rate.per_hour == pytest.approx(3 / 20)
    assert before.spot.rate.per_hour == pytest.approx(0.1)
    assert after.spot.expected.usd > before.spot.expected.usd


# -- the plan: quotes beside the on-demand options

def test_spot_is_a_quote_of_its_on_demand_option_not_an_offer():
    plan = plan_job(load_spec(SDXL, ["compute.spot=never"]), images=25)
    assert all(o.tier not in ("spot", "min_bid") for o in plan.options)
    vast = next(o for o in plan.options if o.provider == "vast" and o.gpu == "RTX 4090")
    runpod = next(o for o in plan.options if o.provider == "runpod" and o.gpu == "RTX 4090")
    assert vast.spot.bid_per_gpu_hour == 0.12 and vast.spot.tier == "min_bid"
    assert runpod.spot.bid_per_gpu_hour == 0.22 and runpod.spot.tier == "spot"
    assert next(o for o in plan.options if o.gpu == "RTX 3090").spot is None  # no interruptible price
    q = vast.spot
    assert q.low.usd < q.expected.usd < q.high.usd and q.low.hours < q.expected.hours < q.high.hours
    # the interval is Young's at the expected rate, and stays fixed across the range
    assert q.expected.interval == pytest.approx(math.sqrt(2 * spot_job(plan.job, vast, 0.12, None).checkpoint / 0.1))
    assert q.high.interval == q.expected.interval
    js = plan.to_json()
    row = next(r for r in js["options"] if r["provider"] == "vast" and r["gpu"] == "RTX 4090")
    assert row["spot"]["bid_per_gpu_hour"] == 0.12 and len(row["spot"]["usd_range"]) == 2
    assert js["tier"]["tier"] == "on-demand" and js["tier"]["policy"] == "never"


def test_the_spot_job_is_the_options_own_phases():
    plan = plan_job(load_spec(SDXL, ["train.optimizer=adamw"]), images=25)
    opt = next(o for o in plan.options if o.provider == "runpod" and o.gpu == "RTX 4090")
    sj = spot_job(plan.job, opt, 0.22, None)
    hours = {p.name: p.hours for p in opt.phases}
    assert sj.work == pytest.approx(hours["train"] + hours["sampling"] + hours["scoring"])
    assert sj.setup + sj.work + sj.tail == pytest.approx(opt.hours_total)
    assert sj.usd_per_hour == 0.22 and sj.husk_usd_per_hour == 0.0  # RunPod's container disk: $0 stopped
    # the checkpoint: fp32 LoRA + AdamW state = 12 of the estimate's 16 bytes a parameter
    from lorapod.plan.vram import GiB

    mb = plan.job.estimate.parts["LoRA weights, grads, optimizer"] * GiB * 12 / 16 / 1e6
    assert state_mb(plan.job) == pytest.approx(mb)
    assert sj.checkpoint == pytest.approx((2.0 + mb / 400) / 3600)
    assert sj.resetup == pytest.approx(sj.setup + mb / 5 / 3600 + mb / 25 / 3600)
    eight = plan_job(load_spec(SDXL, ["train.optimizer=adamw_8bit"]), images=25).job  # 4 + 2 of 8 + 2 bytes
    assert state_mb(eight) == pytest.approx(eight.estimate.parts["LoRA weights, grads, optimizer"] * GiB * 6 / 10 / 1e6)
    # a spec-fixed interval replaces Young's
    fixed = plan_job(load_spec(SDXL, ["compute.spot_checkpoint_min=5"]), images=25)
    assert next(o for o in fixed.options if o.spot).spot.expected.interval == pytest.approx(5 / 60)


def test_the_bid_ceiling_leaves_spot_out():
    plan = plan_job(load_spec(SDXL, ["compute.max_bid_per_gpu_hour=0.15"]), images=25)
    vast = next(o for o in plan.options if o.provider == "vast" and o.gpu == "RTX 4090")
    runpod = next(o for o in plan.options if o.provider == "runpod" and o.gpu == "RTX 4090")
    assert vast.spot is not None and runpod.spot is None
    assert any("above compute.max_bid_per_gpu_hour $0.15" in w for w in runpod.warnings)


# -- the choice

def _opt(gpu, usd, worst, spot=None):
    return SimpleNamespace(gpu=gpu, provider="vast", fits=True, usd_total=usd, hours_total=1.0,
                           usd_range=[usd * 0.6, worst], spot=spot)


def _quote(exp_usd, hi_usd, hi_hours=1.0):
    out = SimpleNamespace
    return out(expected=out(usd=exp_usd, hours=0.8), high=out(usd=hi_usd, hours=hi_hours), rate=out(high=0.23))


def test_auto_takes_spot_only_when_its_worst_end_wins_within_the_caps():
    od = _opt("RTX 3090", 0.20, 0.40)
    cheap = _opt("RTX 4090", 0.37, 0.70, _quote(0.15, 0.30))
    opts = [od, cheap]
    got = decide(opts, "auto", None, None)
    assert (got.tier, got.option) == ("spot", 1) and "$0.30" in got.reason and "$0.40" in got.reason
    # worst end above on-demand's at the same speed: on-demand
    opts[1] = _opt("RTX 4090", 0.37, 0.70, _quote(0.15, 0.41))
    got = decide(opts, "auto", None, None)
    assert got.tier == "on-demand" and "does not beat on-demand's $0.40" in got.reason
    # within the price, over the cap or the deadline: on-demand
    opts[1] = cheap
    assert decide(opts, "auto", 0.25, None).tier == "on-demand"
    assert "compute.max_usd" in decide(opts, "auto", 0.25, None).reason
    assert "compute.max_hours" in decide(opts, "auto", None, 0.9).reason
    assert decide(opts, "auto", 0.30, 1.0).tier == "spot"
    assert decide(opts, "never", None, None).tier == "on-demand"
    assert decide(opts, "always", None, None).tier == "spot"
    assert decide([od], "always", None, None).tier == "on-demand"  # nothing priced on spot


# the guide's job as the guide ran it, without the quality autopilot's scoring: its ~20 minutes of
# scoring images push spot's worst end past the example's compute.max_hours of 3 h
GUIDE_AS_RUN = ["quality.score=off"]


def test_plan_auto_picks_spot_on_the_example():
    plan = plan_job(load_spec(SDXL, ["compute.spot=auto", *GUIDE_AS_RUN]), images=25)
    assert plan.tier.tier == "spot"
    chosen = plan.options[plan.tier.option]
    assert chosen.spot.high.usd < plan.best.usd_range[1]
    assert plan.best.tier != "min_bid"  # best stays the cheapest on-demand option: what a run rents


def test_spec_refuses_unknown_policies():
    with pytest.raises(SpecError):
        load_spec(SDXL, ["compute.spot=sometimes"])
    with pytest.raises(SpecError):
        load_spec(SDXL, ["compute.max_bid_per_gpu_hour=-1"])


def test_plan_prints_both_tiers_and_the_choice(monkeypatch):
    from rich.console import Console
    from typer.testing import CliRunner

    from lorapod.cli import plan as plan_cli
    from lorapod.cli.main import build_app

    # cli/plan.py's console fixed its width when the module was first imported (rich reads COLUMNS
    # once, in Console()), which under xdist is whatever an earlier test's process had: the wide
    # table (tier and preemption-rate columns) needs 120+, so give this test its own wide console.
    monkeypatch.setattr(plan_cli, "console", Console(width=160))
    r = CliRunner().invoke(build_app(), ["plan", str(SDXL), "--images", "25", "--set", "compute.spot=auto",
                                         "--set", GUIDE_AS_RUN[0]])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "Spot (interruptible): expected per job, preemptions included" in out
    assert "min_bid" in out and "0.1 (0.011-0.23)" in out
    assert "tier: spot (compute.spot: auto): spot on RTX 4090 on vast" in out
    assert "lorapod run rents the tier chosen here" in out


def test_the_monte_carlo_agrees_with_the_closed_form():
    """bench/spot_expected.py plays the process out preemption by preemption; its mean must match
    the algebra within the simulation's error (fixed seed: deterministic)."""
    import importlib.util
    import random
    import statistics

    path = Path(__file__).resolve().parents[1] / "bench" / "spot_expected.py"
    mod_spec = importlib.util.spec_from_file_location("spot_expected", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    rng = random.Random(1)
    runs = [mod.simulate(JOB, 0.5, 0.5, rng) for _ in range(4000)]
    cf = expected(JOB, 0.5, 0.5)
    for i, want in ((0, cf.hours), (1, cf.billed_hours), (2, cf.usd), (3, cf.preemptions)):
        xs = [r[i] for r in runs]
        se = statistics.stdev(xs) / math.sqrt(len(xs))
        assert abs(statistics.fmean(xs) - want) < 4 * se, (i, statistics.fmean(xs), want, se)


def test_the_choice_follows_the_options_as_printed():
    """--sort time reorders the options after planning: the choice still names the right one and
    still compares with the cheapest on-demand option, not the first."""
    plan = plan_job(load_spec(SDXL, ["compute.spot=auto", *GUIDE_AS_RUN]), images=25)
    chosen = plan.options[plan.tier.option]
    cheapest = plan.best
    plan.options.sort(key=lambda o: (not o.fits, o.hours_total, o.usd_total))
    assert plan.options[0] is not cheapest
    assert plan.options[plan.tier.option] is chosen
    assert f"on-demand's ${cheapest.usd_range[1]:.2f} ({cheapest.gpu} on {cheapest.provider})" in plan.tier.reason
    assert plan.to_json()["tier"]["option"] == plan.options.index(chosen)


# -- the save on SIGTERM must fit the provider's window (issue 36, item 2)

def test_a_save_that_cannot_fit_runpods_5_s_refuses_always_and_makes_auto_rent_on_demand():
    from lorapod.plan.spot import GRACE_S, SAVE_MARGIN

    assert GRACE_S == {"runpod": 5.0}  # runpod/docs pods/pricing.mdx; Vast.ai documents no signal
    slow = load_spec(SDXL, ["compute.spot=always", "compute.spot_save_mb_s=20"])  # 512 MB-ish at 20 MB/s
    plan = plan_job(slow, provider="runpod", images=25)
    quotes = [o.spot for o in plan.options if o.spot is not None and o.fits]
    assert quotes and all(not q.save_fits and q.save_s * SAVE_MARGIN > 5.0 for q in quotes)
    with pytest.raises(SpecError) as got:
        _ = plan.tier
    line = got.value.message
    assert line.startswith("compute.spot: always: a checkpoint takes about ") and "\n" not in line
    assert "does not fit the 5 s runpod gives between SIGTERM and SIGKILL" in line
    auto = plan_job(load_spec(SDXL, ["compute.spot=auto", "compute.spot_save_mb_s=20"]), provider="runpod", images=25)
    assert auto.tier.tier == "on-demand" and "would lose work at a preemption" in auto.tier.reason
    # a fast enough save: spot again; Vast.ai has no window to fit
    fast = plan_job(load_spec(SDXL, ["compute.spot=always", "compute.spot_save_mb_s=5000"]), provider="runpod",
                    images=25)
    assert fast.tier.tier == "spot" and all(o.spot.save_fits for o in fast.options if o.spot is not None)
    vast = plan_job(load_spec(SDXL, ["compute.spot=always", "compute.spot_save_mb_s=20"]), provider="vast", images=25)
    assert vast.tier.tier == "spot" and next(o.spot for o in vast.options if o.spot).grace_s is None


def test_the_save_estimate_is_one_micro_batch_plus_the_state_at_the_measured_rate():
    from lorapod.plan.spot import SAVE_MB_S, save_on_sigterm_s

    spec = load_spec(SDXL, ["compute.spot=auto"])
    plan = plan_job(spec, provider="runpod", images=25)
    opt = next(o for o in plan.options if o.spot is not None)
    job = plan.job
    micro = opt.speed.seconds_per_step  # the planner's seconds per micro-batch on this GPU
    assert save_on_sigterm_s(job, opt) == pytest.approx(micro + state_mb(job) / SAVE_MB_S)
    assert opt.spot.to_json()["save_on_sigterm_s"] == round(opt.spot.save_s, 2)


def test_a_fixed_train_phase_is_not_one_micro_batch():
    """compute.phases.train_min fixes the phase's minutes, not the step's seconds: the save estimate
    still waits one micro-batch (a 20-minute phase read as one micro-batch refused every spot offer)."""
    from lorapod.plan.spot import save_on_sigterm_s

    llm = EXAMPLES / "llm-chat-lora.yaml"
    short = ["compute.spot=auto", "train.max_steps=16", "model.id=Qwen/Qwen2.5-0.5B", "compute.gpu=null",
             "compute.provider=runpod"]
    fixed = plan_job(load_spec(llm, [*short, "compute.phases.train_min=20"]), provider="runpod", examples=20)
    free = plan_job(load_spec(llm, short), provider="runpod", examples=20)
    a = next(o for o in fixed.options if o.spot is not None)
    b = next(o for o in free.options if o.gpu == a.gpu and o.spot is not None)
    assert save_on_sigterm_s(fixed.job, a) == pytest.approx(save_on_sigterm_s(free.job, b))
    assert a.spot.save_s < 60


def test_decide_skips_spot_quotes_whose_save_does_not_fit():
    od = _opt("RTX 3090", 0.20, 0.40)
    q = _quote(0.15, 0.30)
    q.save_fits, q.save_s, q.grace_s = False, 6.0, 5.0
    opts = [od, _opt("RTX 4090", 0.37, 0.70, q)]
    assert decide(opts, "auto", None, None).tier == "on-demand"
    with pytest.raises(SpecError, match="does not fit the 5 s vast gives"):
        decide(opts, "always", None, None)
