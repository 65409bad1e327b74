"""``lorapod import`` (a trainer's config -> a lorapod spec) and the hidden ``lorapod trainer-run``
(the job wrapper that runs an external trainer on the instance, :mod:`lorapod.trainers.runner`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from lorapod.trainers import hint as trainer_hint

console = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("trainer-run", hidden=True)
    def trainer_run(
        trainer: str = typer.Argument(..., help=trainer_hint()),
        spec: Path = typer.Argument(..., help="The job spec (its paths point at this machine's copies)."),
        run_dir: Path = typer.Option(..., "--run-dir", help="The run folder to fill."),
        src: str | None = typer.Option(None, "--src", help="A checkout of the trainer on this machine (used as "
                                       "is), or a git URL to clone at the pinned commit."),
        work: Path | None = typer.Option(None, "--work", help="Where the trainer's checkout and outputs go "
                                         "(default: the spec's folder)."),
        stop_wait_s: float = typer.Option(240.0, "--stop-wait-s", help="After STOP, how long to wait for the "
                                          "trainer's next save before ending it."),
        poll_s: float = typer.Option(1.0, "--poll-s", hidden=True),
    ) -> None:
        """Run an external trainer under lorapod's run-folder contract (the job command of `run --trainer`)."""
        from lorapod.spec import load_spec
        from lorapod.trainers.runner import run_trainer

        spec_obj = load_spec(spec)
        state = run_trainer(spec_obj, trainer, run_dir, work or spec.resolve().parent, python=sys.executable,
                            src=src, stop_wait_s=stop_wait_s, poll_s=poll_s,
                            say=lambda m: print(m, flush=True))
        print(f"lorapod trainer-run: {state}", flush=True)
        if state == "preempted":  # SIGTERM: saved what the trainer could (trainers/runner.py)
            from lorapod.errors import PREEMPTED_EXIT

            sys.exit(PREEMPTED_EXIT)

    @app.command("import")
    def import_(
        file: Path = typer.Argument(..., help="A trainer's config: its job YAML, or a dataset TOML with "
                                 "--flags (a file none of them reads gets the list of kinds)."),
        flags: str = typer.Option("", "--flags", help="With a dataset TOML: the training command's options, quoted: "
                                  "--flags \"--network_dim 16 --learning_rate 1e-4 ...\""),
        out: Path | None = typer.Option(None, "--out", "-o", help="Write the spec here (default: stdout)."),
    ) -> None:
        """Turn a trainer's config into a lorapod spec; every setting without an equivalent is listed."""
        from lorapod.trainers.importer import import_file

        result = import_file(file, flags)
        text = result.to_yaml()
        if out:
            out.write_text(text, encoding="utf-8")
            console.print(f"spec written to {out} (from {result.source})")
        else:
            typer.echo(text, nl=False)
        if result.unmapped:
            console.print(f"{len(result.unmapped)} setting(s) without a lorapod equivalent:")
            for key, why in result.unmapped:
                console.print(f"  - {key}: {why}")
