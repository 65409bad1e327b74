"""``loss.png`` in the run folder: training loss (smoothed) and validation loss against steps.

A person judging a run would rather look at a curve than read metrics.jsonl; the plot is made
from the same file, so a pulled remote run can be plotted at home too (``plot_metrics(run)``).
"""

from __future__ import annotations

from pathlib import Path

from lorapod.engine.metrics import read_metrics


def plot_metrics(metrics_file: Path, out: Path) -> Path | None:
    """Write the loss plot; returns None (and writes nothing) when there is nothing to plot or
    matplotlib is missing."""
    records = read_metrics(metrics_file)
    train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), int | float)]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("event") == "eval" and isinstance(r.get("val_loss"), int | float)]
    if not train and not val:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        steps, losses = zip(*train, strict=True)
        k = max(1, len(losses) // 25)
        ax.plot(steps, losses, color="#9ecae1" if k > 1 else "#3182bd", linewidth=0.8 if k > 1 else 1.6, label="train loss")
        if k > 1:
            smooth = [sum(losses[max(0, i - k + 1) : i + 1]) / len(losses[max(0, i - k + 1) : i + 1]) for i in range(len(losses))]
            ax.plot(steps, smooth, color="#3182bd", linewidth=1.6, label=f"train loss ({k}-step mean)")
    if val:
        vs, vl = zip(*val, strict=True)
        ax.plot(vs, vl, "o-", color="#e6550d", linewidth=1.4, markersize=4, label="validation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(Path(metrics_file).parent.name, fontsize=9)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
