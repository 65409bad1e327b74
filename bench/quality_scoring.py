"""What the quality autopilot costs and saves: the seconds of scoring one checkpoint on this CPU with
the tiny models, the planner's minutes and dollars of scoring per GPU for the SDXL guide's job, and
the dollars a plateau stop saves on that job at the planner's figures.

    PYTHONPATH=src python bench/quality_scoring.py [--repeats 3]

1. CPU: a tiny SD 1.5 (builtin/sd.py) at 64 px and the tiny random scorers (builtin/scorers.py),
   the spec's defaults (6 scoring prompts, strengths 0.6/0.8/1.0, 20 sampling steps): one checkpoint
   scored through the engine's own path (the recipe's ``render``, quality/autopilot.py), split into
   drawing and scoring (embedding + pHash); and the tiny Llama's LLM scoring (16 held-out answers,
   64 new tokens, batched, and a held-out pass).
2. The planner (plan/cost.py ``scoring_minutes``): the scoring phase of examples/sdxl-object-lora.yaml
   (25 images, 2,000 steps, a checkpoint every 2 epochs) on each GPU of the catalog that fits it,
   with the cheapest snapshot price.
3. A plateau stop on the same job saving every epoch (8 checkpoints): if the score peaks at epoch k,
   ``train.stop_when: {plateau: 2}`` stops at epoch k + 2; the steps and the scoring not done, in
   minutes and dollars at the planner's speed and the cheapest RTX 4090 price.

Prints markdown tables (docs/quality.md keeps them, with the machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
ROOT = Path(__file__).resolve().parents[1]
SDXL = ROOT / "examples" / "sdxl-object-lora.yaml"


def cpu_image(repeats: int) -> tuple[float, float, int]:
    """(seconds to draw, seconds to score, images) for one checkpoint, median of ``repeats``."""
    import torch

    from lorapod.builtin.sd import build_sd15
    from lorapod.demo_image import write_images
    from lorapod.engine import distributed
    from lorapod.engine.autopilot import image_autopilot, plan_image
    from lorapod.engine.diffusion import prepare
    from lorapod.quality import autopilot as ap
    from lorapod.rundir import RunDir
    from lorapod.spec import validate

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    model = build_sd15(tmp / "sd15")
    data = write_images(tmp / "data", n=9)
    spec = validate({"model": {"id": str(model), "family": "sd15"}, "method": {"r": 4, "alpha": 8},
                     "data": {"path": str(data), "format": "images", "resolution": 64, "trigger": "zxq"},
                     "quality": {"clip": "lorapod:tiny-clip", "dino": "lorapod:tiny-dinov2"},
                     "train": {"precision": "fp32"}})
    draw, score, images = [], [], 0
    for r in range(repeats):
        run = RunDir.create(tmp / "runs", f"r{r}")
        run.write_spec(spec)
        world, _ = distributed.init("cpu")
        plan = plan_image(spec, world, lambda m: None)
        recipe, _, _ = prepare(spec, run, "cpu", lambda m: None, tmp / "cache", quality=plan)
        spent = {"draw": 0.0, "n": 0}
        real = recipe.render

        def timed(sp, s, real=real, spent=spent):
            t = time.perf_counter()
            out = real(sp, s)
            spent["draw"] += time.perf_counter() - t
            spent["n"] += 1
            return out

        recipe.render = timed
        pilot = image_autopilot(spec, run, recipe, plan, "cpu", lambda m: None)
        assert isinstance(pilot.scoring, ap.ImageScoring)
        pilot.scoring.measure(1)  # the base row first: drawn once per run, not per checkpoint
        spent.update(draw=0.0, n=0)
        t = time.perf_counter()
        pilot.on_checkpoint(2, 100)
        total = time.perf_counter() - t
        draw.append(spent["draw"])
        score.append(total - spent["draw"])
        images = spent["n"]
    return statistics.median(draw), statistics.median(score), images


def cpu_llm(repeats: int) -> float:
    import torch

    from lorapod.builtin import llm
    from lorapod.demo import write_jsonl
    from lorapod.engine.llm import train_llm
    from lorapod.rundir import RunDir
    from lorapod.rundir import quality as files
    from lorapod.spec import validate

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    train, val = llm.build_dataset()
    write_jsonl(tmp / "t.jsonl", train)
    write_jsonl(tmp / "v.jsonl", val)
    out = []
    for r in range(repeats):
        spec = validate({"model": {"id": "lorapod:tiny-llama", "family": "llm"},
                         "data": {"path": str(tmp / "t.jsonl"), "val_path": str(tmp / "v.jsonl"), "sequence_len": 256},
                         "train": {"max_steps": 4, "micro_batch_size": 2, "learning_rate": 3e-3},
                         "save": {"every_steps": 2, "every_epochs": None}, "eval": {"every_steps": 2}})
        run = RunDir.create(tmp / "runs", f"r{r}")
        run.write_spec(spec)
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
        out.append(files.read_scores(run.root)[-1]["seconds"])  # the second checkpoint: the base is done
    return statistics.median(out)


def planner_rows() -> list[str]:
    from lorapod.plan.choose import plan_job
    from lorapod.spec import load_spec

    plan = plan_job(load_spec(SDXL), images=25)
    rows, seen = [], set()
    for o in sorted(plan.options, key=lambda o: o.usd_per_hour):
        if not o.fits or o.gpu in seen:
            continue
        seen.add(o.gpu)
        phase = {p.name: p for p in o.phases}
        s = phase.get("scoring")
        if s is None:
            continue
        ck = plan.job.checkpoints
        rows.append(f"| {o.gpu} | {o.provider} {o.tier} ${o.usd_per_hour:.2f}/h | {phase['train'].hours * 60:.0f} | "
                    f"{s.hours * 60:.1f} ({s.hours * 60 / ck:.1f} per checkpoint) | ${s.usd:.2f} | "
                    f"{100 * s.usd / o.usd_compute:.0f}% |")
    return rows


def plateau_rows() -> tuple[list[str], str]:
    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.choose import plan_job
    from lorapod.plan.cost import scoring_minutes
    from lorapod.plan.estimate import step_speed
    from lorapod.spec import load_spec

    spec = load_spec(SDXL, ["save.every_epochs=1"])
    plan = plan_job(spec, images=25, gpu="RTX 4090")
    opt = plan.best
    job = plan.job
    g = find_gpu("RTX 4090")
    speed = step_speed(job.model, job.settings, g, job.estimate)
    from dataclasses import replace

    per_ckpt_min = (scoring_minutes(job, speed) - scoring_minutes(replace(job, checkpoints=1), speed)) / (job.checkpoints - 1)
    steps_per_epoch = job.optimizer_steps // spec.train.epochs
    rows = []
    for peak in range(1, spec.train.epochs - 1):
        stop = peak + 2
        left = spec.train.epochs - stop
        if left <= 0:
            continue
        minutes = left * steps_per_epoch * speed.seconds_per_step / 60 + left * per_ckpt_min
        rows.append(f"| epoch {peak} (step {peak * steps_per_epoch}) | epoch {stop} (step {stop * steps_per_epoch}) | "
                    f"{left * steps_per_epoch} | {minutes:.0f} | ${minutes / 60 * opt.usd_per_hour:.2f} | "
                    f"{100 * minutes / 60 * opt.usd_per_hour / opt.usd_total:.0f}% |")
    head = (f"{job.optimizer_steps} steps, {job.checkpoints} checkpoints, {speed.seconds_per_step:.2f} s/step, "
            f"{per_ckpt_min:.1f} min of scoring per checkpoint, {opt.provider} {opt.tier} ${opt.usd_per_hour:.2f}/h, "
            f"the whole job ${opt.usd_total:.2f}")
    return rows, head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import platform

    draw, score, n = cpu_image(a.repeats)
    llm_s = cpu_llm(a.repeats)
    print(f"machine: {platform.processor() or platform.machine()}, one torch thread\n")
    print("| scoring one checkpoint (CPU, tiny models) | seconds |\n|---|---:|")
    print(f"| image, tiny SD 1.5 64 px: drawing {n} images (6 prompts x 3 strengths, 20 steps) | {draw:.1f} |")
    print(f"| image: scoring them (tiny CLIP + tiny DINOv2 embeddings, pHash vs training images) | {score:.2f} |")
    print(f"| LLM, tiny Llama: 16 held-out answers (64 tokens, batched) + held-out loss | {llm_s:.2f} |\n")
    print("| GPU | cheapest price | train min | scoring min | scoring $ | share of the job's GPU $ |\n"
          "|---|---|---:|---:|---:|---:|")
    print("\n".join(planner_rows()))
    rows, head = plateau_rows()
    print(f"\nplateau stop (train.stop_when: {{plateau: 2}}) on the SDXL guide's job saving every epoch: {head}\n")
    print("| the score peaks at | the run stops at | steps not run | minutes saved | dollars saved | of the job |\n"
          "|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
