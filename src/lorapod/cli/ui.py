"""``lorapod ui``: the local dashboard (runs, live charts, samples, spend against the cap)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True, highlight=False)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def ui(
    paths: list[Path] = typer.Argument(None, help="Run folders, or folders to look for run folders in (3 levels "
                                       "deep). Default: the current folder. Ledger jobs are always shown."),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0 = any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on. Anything but loopback lets "
                             "others on that network reach the page (the token still guards it)."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
    data: list[Path] = typer.Option([], "--data", help="A dataset folder the Data page offers (repeatable)."),
    spec: list[Path] = typer.Option([], "--spec", help="A job spec the Plan page offers (repeatable)."),
) -> None:
    """Serve a dashboard on 127.0.0.1: every run with its spend against the cap, live charts, samples,
    evals and logs, and buttons to pull, stop at the next save, or destroy now."""
    from lorapod.errors import require

    for mod in ("starlette", "uvicorn", "jinja2", "PIL"):
        require(mod, "ui", "lorapod ui")
    from lorapod.ui.guard import new_token
    from lorapod.ui.runs import RunIndex
    from lorapod.ui.server import Dashboard, open_socket, serve_forever

    if host not in LOOPBACK:
        err.print(f"[bold yellow]warning:[/] listening on {host}: anyone who can reach this address and learns the "
                  "token can destroy your instances. The traffic is plain HTTP.")
    roots = list(paths or [Path.cwd()])
    for p in [*roots, *data, *spec]:
        if not p.exists():
            from lorapod.errors import LorapodError

            raise LorapodError(f"{p} does not exist", hint="give run folders, dataset folders and spec files that exist")
    token = new_token()
    dash = Dashboard(RunIndex(roots), token, data_folders=data, spec_files=spec)
    sock = open_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/?token={token}"
    typer.echo(f"lorapod ui: {url}", err=False)
    err.print("[dim]the token in the address is the key; Ctrl-C stops the dashboard (your runs go on)[/]")
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    serve_forever(dash, sock)


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
