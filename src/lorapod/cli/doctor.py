"""``lorapod doctor runpod|vast``: one real instance, checked for cents (compute/doctor.py)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor(
        provider: str = typer.Argument(..., help="A provider that rents instances (see `lorapod doctor --help`'s "
                                       "list: the registered ones with in-instance checks)."),
        yes: bool = typer.Option(False, "--yes", help="Rent the instance (at most the printed cap)."),
        as_json: bool = typer.Option(False, "--json", help="The report as JSON on stdout."),
        spot: bool = typer.Option(False, "--spot", help="Rent the cheapest spot (interruptible) offer at its bid: "
                                  "proves the bid is accepted and, on RunPod, that a preemption's SIGTERM reaches "
                                  "the job."),
        max_bid: float | None = typer.Option(None, "--max-bid", help="With --spot: the highest bid per GPU-hour."),
        deadman_min: float | None = typer.Option(None, "--deadman-min", help="The instance destroys itself this many "
                                                 "minutes after its start unless this doctor reached it (default: "
                                                 "the plan's, at most the doctor's 10 minutes; docs/remote.md)."),
    ) -> None:
        """Rent the cheapest in-stock GPU for at most 10 minutes and check what the tests cannot:
        SSH and the key, rsync and Python, the scoped key destroying the instance from inside, the
        provider's GET after it, the price reported against the price offered. Prints the cap in
        cents first; nothing is rented without --yes."""
        from lorapod.compute.doctor import MAX_MINUTES, cap_usd, cheapest_offer, run_doctor
        from lorapod.compute.provider import doctor_facts, get, names
        from lorapod.errors import LorapodError
        from lorapod.store.ledger import Ledger

        if doctor_facts(provider) is None:
            checkable = [n for n in names() if doctor_facts(n) is not None]
            raise LorapodError(f"lorapod doctor checks a rented instance; '{provider}' is not one",
                               hint=f"use one of: {', '.join(checkable)}")
        prov = get(provider)
        offer = cheapest_offer(prov, spot=spot, max_bid_per_gpu_hour=max_bid)
        cap = cap_usd(offer)
        console.print(f"{provider}{' spot' if spot else ''}: {escape(offer.gpu_name)} ({escape(offer.id)}) at "
                      f"${offer.usd_per_hour:.3f}/h{' (the bid)' if spot else ''}; "
                      f"cap {cap * 100:.1f} cents (at most {MAX_MINUTES:g} minutes)", markup=True)
        if not yes:
            console.print("nothing was rented; run again with --yes to check it")
            return
        if deadman_min is not None:
            from lorapod.compute.context import bounded

            bounded("--deadman-min", deadman_min, 0.0, MAX_MINUTES)
        report = run_doctor(prov, offer, Ledger(), say=lambda m: console.print(m, style="dim", markup=False),
                            deadman_min=deadman_min)
        if as_json:
            typer.echo(json.dumps(report.to_dict()))
        else:
            table = Table(title=f"lorapod doctor {provider}{' --spot' if spot else ''}")
            for col in ("check", "result", "evidence"):
                table.add_column(col, overflow="fold")
            for c in report.checks:
                mark = "[green]ok[/]" if c.ok else "[red]FAIL[/]" if c.ok is False else "-"
                table.add_row(c.name, mark, escape(c.evidence))
            console.print(table)
            console.print(("[bold green]passed[/]" if report.passed else "[bold red]failed[/]")
                          + ": stored in the ledger")
        if not report.passed:
            raise typer.Exit(1)
