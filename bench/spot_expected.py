"""Spot vs on-demand for the planner's own jobs, at several preemption rates: the closed form of
``lorapod.plan.spot`` checked against a Monte Carlo of the same process.

    PYTHONPATH=src python bench/spot_expected.py [--runs 20000] [--seed 0]

Jobs (the planner's estimates, snapshot prices; docs/remote.md, Spot):

* SDXL, 25 images x 10 repeats x 8 epochs = 2,000 steps (examples/sdxl-object-lora.yaml), on an
  RTX 4090: RunPod (cheapest seen $0.34/h vs spot $0.22/h) and Vast.ai ("from" $0.31/h vs min_bid
  $0.12/h);
* a 7B LoRA (examples/llm-chat-lora.yaml with Qwen2.5 7B, 1,000 chat examples, 3 epochs) on an
  A100 80GB at RunPod (price page $1.59/h vs spot $0.59/h).

For each rate the checkpoint interval is Young's at that rate. The Monte Carlo draws
exponential times to preemption and plays the run out step by step (setup, stretches of training
between checkpoints, a wait and a new setup after each preemption), independently of the closed
form's algebra; the two must agree within the simulation's error. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
ROOT = Path(__file__).resolve().parents[1]

RATES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


def simulate(job, rate: float, interval: float, rng: random.Random) -> tuple[float, float, float, int]:
    """One run: (wall hours, billed hours, dollars, preemptions)."""

    def exposed(duration: float) -> tuple[bool, float]:
        if rate <= 0:
            return True, duration
        x = rng.expovariate(rate)
        return (True, duration) if x >= duration else (False, x)

    wall = billed = 0.0
    n = 0
    while True:  # the first setup, started over on a new instance after each preemption
        ok, dt = exposed(job.setup)
        wall, billed = wall + dt, billed + dt
        if ok:
            break
        n += 1
        wall += job.wait
    left = job.work
    while left > 1e-12:
        chunk = min(interval, left)
        ok, dt = exposed(chunk + job.checkpoint)
        wall, billed = wall + dt, billed + dt
        if ok:
            left -= chunk
            continue
        n += 1  # back to the newest checkpoint: wait, then set a new instance up
        while True:
            wall += job.wait
            ok, dt = exposed(job.resetup)
            wall, billed = wall + dt, billed + dt
            if ok:
                break
            n += 1
    wall, billed = wall + job.tail, billed + job.tail
    usd = (billed * (job.usd_per_hour + job.storage_usd_per_hour) + n * job.husk * job.husk_usd_per_hour
           + (1 + n) * job.per_setup_usd)
    return wall, billed, usd, n


def cases():
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    # the jobs as the guides ran them: without the quality autopilot's scoring (docs/quality.md), whose
    # minutes would move every row of the published table
    sdxl = load_spec(ROOT / "examples" / "sdxl-object-lora.yaml", ["quality.score=off"])
    llm = load_spec(ROOT / "examples" / "llm-chat-lora.yaml", ["model.id=Qwen/Qwen2.5-7B-Instruct", "quality.score=off"])
    plans = [("SDXL 2,000 steps", sdxl, plan_job(sdxl, images=25, gpu="RTX 4090")),
             ("7B LoRA, 1,000 examples x 3", llm, plan_job(llm, examples=1000, gpu="A100 80GB"))]
    for name, spec, plan in plans:
        for opt in plan.options:
            if opt.spot is not None and opt.tier in ("cheapest_seen", "from", "price_page"):
                if opt.provider == "runpod" and opt.gpu == "RTX 4090" and opt.tier != "cheapest_seen":
                    continue
                yield name, spec, plan, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from lorapod.plan.choose import plan_job
    from lorapod.plan.spot import expected, spot_job, young_interval

    rng = random.Random(args.seed)
    print("| job | GPU, provider | preempt/h | on-demand $ / h | spot $ (closed form) | spot $ (Monte Carlo) "
          "| spot h | preemptions | ckpt every | auto picks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, spec, plan, opt in cases():
        bid = opt.spot.bid_per_gpu_hour
        sj = spot_job(plan.job, opt, bid, None)
        for rate in RATES:
            tau = young_interval(sj.checkpoint, rate)
            cf = expected(sj, rate, tau)
            runs = [simulate(sj, rate, tau, rng) for _ in range(args.runs)]
            usd = [r[2] for r in runs]
            mean, se = statistics.fmean(usd), statistics.stdev(usd) / math.sqrt(len(usd))
            hours = statistics.fmean(r[0] for r in runs)
            n = statistics.fmean(r[3] for r in runs)
            if se > 0:
                worst = max(worst, abs(mean - cf.usd) / se)
            auto = "-"
            if rate > 0:
                pr = plan_job(spec.model_copy(update={"compute": spec.compute.model_copy(
                    update={"spot": "auto", "preemptions_per_hour": rate})}),
                    images=25 if plan.job.is_image else None, examples=None if plan.job.is_image else 1000,
                    gpu=opt.gpu, provider=opt.provider)
                auto = pr.tier.tier if pr.tier else "-"
                why = pr.tier.reason if pr.tier else ""
                auto += next((f" ({k})" for k, w in (("max_hours", "compute.max_hours"), ("max_usd", "compute.max_usd"),
                                                     ("costs more", "does not beat")) if w in why and auto != "spot"), "")
            every = f"{tau * 60:.0f} min" if math.isfinite(tau) else "-"
            print(f"| {name} | {opt.gpu}, {opt.provider} ${bid:.2f} spot | {rate:g} | ${opt.usd_total:.2f} / "
                  f"{opt.hours_total:.2f} h | ${cf.usd:.3f} | ${mean:.3f} ± {se:.3f} | {cf.hours:.2f} ({hours:.2f}) "
                  f"| {cf.preemptions:.2f} ({n:.2f}) | {every} | {auto} |")
    print(f"\nlargest |Monte Carlo - closed form| / standard error: {worst:.2f} ({args.runs} runs per row)")


if __name__ == "__main__":
    main()
