"""The ``lorapod`` entry point: builds the typer app and turns LorapodError into one clean message.

Command modules are listed in ``COMMANDS`` and each exposes ``register(app)``: adding a command
group is one line here and one module beside this file.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from lorapod.errors import LorapodError

COMMANDS = ["train", "demo", "plan", "data", "run", "jobs", "ledger", "export", "eval", "trainers", "sweep",
            "doctor", "ui", "volumes", "deploy"]

err_console = Console(stderr=True)


def build_app() -> typer.Typer:
    from lorapod.cli.helptext import LorapodGroup

    app = typer.Typer(
        cls=LorapodGroup,
        name="lorapod",
        help="Plan, check, train and run LoRA fine-tunes on rented GPUs, with no instance left running.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(
        debug: bool = typer.Option(False, "--debug", help="Show full tracebacks.", envvar="LORAPOD_DEBUG"),
    ) -> None:
        if debug:
            os.environ["LORAPOD_DEBUG"] = "1"

    for name in COMMANDS:
        importlib.import_module(f"lorapod.cli.{name}").register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    app = build_app()
    try:
        # Not standalone, typer returns the exit code of a ``typer.Exit(code)`` (and turns Ctrl-C
        # outside training into Exit(130)) instead of exiting: pass it on, or it would read as 0.
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            if code == 130:
                err_console.print("[yellow]interrupted[/]")
            sys.exit(code)
    except LorapodError as exc:
        if os.environ.get("LORAPOD_DEBUG"):
            err_console.print_exception()
        # escape(): messages quote tools' output ("[sender]", paths), which is not rich markup.
        err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err_console.print(f"  [cyan]->[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and real bugs
        if isinstance(exc, _click_classes("ClickException")):
            exc.show()  # the usage line, "did you mean ...", exit 2 for usage errors
            sys.exit(exc.exit_code)
        if isinstance(exc, _click_classes("Abort")):
            err_console.print("[yellow]aborted[/]")
            sys.exit(130)
        raise


def _click_classes(name: str) -> tuple[type, ...]:
    """``name`` from every click typer may raise: typer >= 0.20 vendors its own copy as
    ``typer._click`` whose exceptions are not ``click``'s, older typer raises ``click``'s."""
    found = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


if __name__ == "__main__":
    main()
