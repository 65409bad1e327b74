"""Draw a run's quality curve: the autopilot's score per checkpoint (one line per strength, its standard
error as a band), the pick starred, and the early stop when train.stop_when made one.

    python tools/quality_curve.py RUN_FOLDER --out docs/quality-curve.png [--title TEXT]

It reads the run folder's ``quality/`` through lorapod's own reader (rundir/quality.py), the files the
engine, the trainer runner or ``lorapod eval`` wrote; docs/quality.md shows the curves it drew for the
demos.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def draw(run: Path, out: Path, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lorapod.rundir import quality as files

    scores = files.read_scores(run)
    if not scores:
        raise SystemExit(f"{run} has no quality/scores.jsonl: nothing scored")
    pick = files.read_json(run, files.PICK) or {}
    stop = files.read_json(run, files.STOPPED)
    strengths = sorted({k for r in scores for k in r["strengths"]}, key=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    colours = ["#9ecae1", "#4292c6", "#08519c", "#6a51a3", "#cb181d"]
    for i, s in enumerate(strengths):
        pts = [(r["step"], e["score"], e.get("se") or 0.0) for r in scores
               if isinstance(e := r["strengths"].get(s), dict) and isinstance(e.get("score"), int | float)]
        if not pts:
            continue
        xs, ys, se = zip(*pts, strict=True)
        c = colours[i % len(colours)]
        ax.plot(xs, ys, "o-", color=c, label=f"strength {float(s):g}", markersize=4)
        ax.fill_between(xs, [y - e for y, e in zip(ys, se, strict=True)], [y + e for y, e in zip(ys, se, strict=True)],
                        color=c, alpha=0.15, linewidth=0)
        copies = [(r["step"], r["strengths"][s]["score"]) for r in scores
                  if r["strengths"].get(s, {}).get("memorised") and isinstance(r["strengths"][s].get("score"), int | float)]
        if copies:
            ax.plot(*zip(*copies, strict=True), "x", color="#cb181d", markersize=9, label="copies a training image")
    ax.axhline(0.0, color="#636363", linestyle="--", linewidth=1, label="base")
    if isinstance(pick.get("step"), int) and isinstance(pick.get("score"), int | float):
        ax.plot([pick["step"]], [pick["score"]], "*", color="#31a354", markersize=16,
                label=f"pick: {pick['checkpoint']} at {pick['strength']:g}")
    if stop is not None and isinstance(stop.get("step"), int):
        ax.axvline(stop["step"], color="#e6550d", linestyle=":", linewidth=1.5, label="train.stop_when")
    ax.set_xlabel("step")
    ax.set_ylabel("score vs the base")
    ax.set_title(title or f"{run.name}: quality per checkpoint", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    print(draw(a.run, a.out, a.title))


if __name__ == "__main__":
    main()
