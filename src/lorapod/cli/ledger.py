"""``lorapod ledger check | rebuild``: is the ledger whole, and what it lacks, from the providers and run folders."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Check the ledger, or rebuild it from the providers and the run folders.",
                        no_args_is_help=True)
    app.add_typer(group, name="ledger")

    runs_help = ("Folders holding run folders (each job's runs/<job-id>/); default: the folders of the jobs "
                 "the ledger knows, and ./runs.")

    @group.command("check")
    def check(
        runs: list[Path] = typer.Option([], "--runs", help=runs_help),
        as_json: bool = typer.Option(False, "--json", help="The findings as JSON on stdout."),
    ) -> None:
        """Whether the ledger file is whole, and what it lacks: this installation's live instances
        that RunPod / Vast.ai list by label, and run folders it has no job for. Changes nothing."""
        from lorapod.compute.ledger_repair import backups
        from lorapod.compute.ledger_repair import check as check_ledger
        from lorapod.errors import LorapodError
        from lorapod.store.ledger import Ledger, LedgerDamaged

        def say(msg: str) -> None:
            err.print(msg, markup=False)

        try:
            ledger = Ledger.read_only()
        except LedgerDamaged as exc:
            if as_json:
                typer.echo(json.dumps({"damage": exc.message, "backups": len(backups(exc_path()))}))
            raise
        found = check_ledger(ledger, say, _roots(ledger, runs))
        if as_json:
            typer.echo(json.dumps(found))
        else:
            say(f"ledger {found['ledger']}: whole; {found['jobs']} job(s), {found['instances']} instance(s), "
                f"{found['backups']} backup(s)")
        if found["missing_instances"] or found["missing_jobs"]:
            raise LorapodError(f"the ledger lacks {found['missing_instances']} live instance(s) and "
                               f"{found['missing_jobs']} job(s)", hint="`lorapod ledger rebuild` records them")

    @group.command("rebuild")
    def rebuild(
        runs: list[Path] = typer.Option([], "--runs", help=runs_help),
        as_json: bool = typer.Option(False, "--json", help="What was added, as JSON on stdout."),
    ) -> None:
        """Set a damaged ledger aside (restoring the newest backup), then record what it lacks:
        live instances the providers list with this installation's label, and run folders."""
        from lorapod.compute.ledger_repair import backup
        from lorapod.compute.ledger_repair import rebuild as rebuild_ledger
        from lorapod.store.ledger import Ledger

        def say(msg: str) -> None:
            err.print(msg, markup=False)

        ledger = Ledger()
        if ledger.notice:
            say(f"warning: {ledger.notice}")
        added = rebuild_ledger(ledger, say, _roots(ledger, runs))
        backup(ledger, force=True)
        ledger.close()
        if as_json:
            typer.echo(json.dumps(added))
        else:
            say(f"added {added['instances']} instance(s) and {added['jobs']} job(s); "
                "`lorapod ps` shows them, `lorapod down --orphans` destroys instances nobody follows")


def exc_path() -> Path:
    from lorapod.home import lorapod_home

    return lorapod_home() / "ledger.db"


def _roots(ledger, runs: list[Path]) -> list[Path]:
    if runs:
        return list(runs)
    roots = {Path(j.run_dir).parent for j in ledger.jobs()}
    return sorted(roots | {Path("runs")})
