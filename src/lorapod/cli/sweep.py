"""``lorapod sweep``: one spec, a grid of overrides, N jobs under one dollar cap, ranked.

Thin: parsing and printing; the checks before renting are
:func:`lorapod.compute.prepare.prepare_sweep`, the work is :mod:`lorapod.compute.sweep`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lorapod.compute.provider import on_hint  # the registry's names (built-ins and plugins), for the help

console = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        spec: Path = typer.Argument(..., help="The job spec (YAML) every job starts from."),
        grid: list[str] = typer.Option(..., "--grid", help="KEY=V1,V2,... (repeat: the jobs are every combination)."),
        on: list[str] = typer.Option([], "--on", help=f"{on_hint()}; repeat for several hosts (default: "
                                     "spec.compute.provider)."),
        parallel: int = typer.Option(1, "--parallel", min=1, help="Jobs at once."),
        max_usd: float | None = typer.Option(None, "--max-usd", help="Total dollar cap across all jobs: no job "
                                             "starts that could cross it; running jobs stop at their share."),
        max_hours: float | None = typer.Option(None, "--max-hours", help="Hour cap per job."),
        set_: list[str] = typer.Option([], "--set", help="Override a spec value for every job."),
        gpu: str | None = typer.Option(None, "--gpu", help="Pin a GPU model."),
        identity: Path | None = typer.Option(None, "--identity", help="SSH private key for ssh:// hosts."),
        usd_per_hour: float | None = typer.Option(None, "--usd-per-hour", help="For ssh:// and local hosts: what "
                                                  "the machine costs, so the cap applies."),
        bootstrap: str = typer.Option("source", "--bootstrap", help="source | wheel (see lorapod run)."),
        python: str = typer.Option("auto", "--python", help="Python on the instances (auto: found there, "
                                   "see lorapod run)."),
        force: bool = typer.Option(False, "--force", help="Rent even when `lorapod data check` finds errors "
                                   "(see lorapod run)."),
        as_json: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
        poll_s: float | None = typer.Option(None, "--poll-s", hidden=True),
        stop_margin_s: float | None = typer.Option(None, "--stop-margin-s", hidden=True),
    ) -> None:
        """Train every combination of --grid values, through the same lifecycle as `lorapod run`,
        under one total --max-usd; print the results ranked by validation loss.

        Every job is checked on every host as `lorapod run` checks one before anything is rented:
        a job that would be refused stops the sweep, named, before the first instance exists."""
        from lorapod.cli.run import dim, given
        from lorapod.compute.prepare import RunFlags, prepare_sweep
        from lorapod.compute.sweep import Sweep

        flags = RunFlags(set_=set_, identity=identity, gpu=gpu, max_hours=max_hours, bootstrap=bootstrap,
                         python=python, force=force, usd_per_hour=usd_per_hour,
                         knobs=given(poll_s=poll_s, stop_margin_s=stop_margin_s))
        prepared = prepare_sweep(spec, grid, on, flags, say=dim,
                                 note=lambda m: console.print(f"note: {m}", style="yellow", markup=False))
        result = Sweep(prepared.spec, grid, prepared.targets, parallel=parallel, max_usd=max_usd,
                       options=prepared.options, spec_path=prepared.spec_path, planned=prepared.jobs,
                       say=lambda m: console.print(m, style="dim", markup=False)).run()
        if as_json:
            typer.echo(json.dumps(result.to_dict()))
        else:
            table = Table(title=f"sweep {result.root.name}: ${result.usd:.2f}"
                          + (f" of ${max_usd:g}" if max_usd is not None else ""))
            for col in ("#", "job", "grid", "state", "val loss", "$", "min"):
                table.add_column(col, justify="right" if col in ("#", "val loss", "$", "min") else "left")
            for rank, j in enumerate(result.ranked, 1):
                table.add_row(str(rank), j.job_id or "-", escape(j.label), j.state,
                              f"{j.loss:.4f}" if j.loss is not None else "-", f"{j.usd:.2f}", f"{j.seconds / 60:.1f}")
            console.print(table)
            if result.winner_adapter:
                console.print(f"winner: {result.winner.label} ({result.winner.job_id}); adapter: {result.winner_adapter}")
            for note in result.notes:
                console.print(note)
            console.print(f"sweep folder: {result.root}", markup=False)
        if result.stopped or all(j.state not in ("done", "stopped") for j in result.jobs):
            sys.exit(130 if result.stopped else 1)
