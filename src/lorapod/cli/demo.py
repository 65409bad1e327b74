"""``lorapod demo``: train a real LoRA offline on this machine and show that it worked."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def demo(
    out: Path = typer.Option(Path("lorapod-demo"), "--out", help="Folder for the model, data, run and adapter."),
    model: str | None = typer.Option(None, "--model", help="Use this model (hub id or folder) instead of building one."),
    steps: int | None = typer.Option(None, "--steps", help="Stop after this many optimizer steps."),
) -> None:
    """Build a tiny model locally, train a LoRA on a bundled chat dataset, show base vs tuned."""
    from lorapod.demo import run_demo

    res = run_demo(out, model=model, steps=steps, log=lambda m: console.print(m, highlight=False))
    console.print()
    if res.base_val_loss is not None and res.tuned_val_loss is not None:
        console.print(
            f"validation loss  base [bold]{res.base_val_loss:.3f}[/]  ->  tuned [bold green]{res.tuned_val_loss:.3f}[/]"
        )
    table = Table(title="before / after (greedy generation, unseen phrasing)")
    table.add_column("question")
    table.add_column("base model")
    table.add_column("with the LoRA", style="green")
    for q, base, tuned in res.samples:
        table.add_row(q, base or "(nothing)", tuned or "(nothing)")
    console.print(table)
    console.print(f"\nbase model : {res.out / 'base-model'}")
    console.print(f"adapter    : {res.out / 'adapter'}  (PEFT: adapter_config.json + adapter_model.safetensors)")
    console.print(f"metrics    : {res.out / 'metrics.jsonl'}  (plot: {res.out / 'loss.png'})")
    console.print(f"spec       : {res.out / 'spec.yaml'}  (train it again: lorapod train {res.out / 'spec.yaml'})")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
