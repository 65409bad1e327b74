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
    from lorapod.ui.app import Dashboard, open_socket, serve_forever
    from lorapod.ui.guard import new_prefix, new_token
    from lorapod.ui.runs import RunIndex

    if host not in LOOPBACK:
        err.print(f"[bold yellow]warning:[/] listening on {host}: anyone who can reach this address and learns the "
                  "token can destroy your instances. The traffic is plain HTTP.")
    roots = list(paths or [Path.cwd()])
    for p in [*roots, *data, *spec]:
        if not p.exists():
            from lorapod.errors import LorapodError

            raise LorapodError(f"{p} does not exist", hint="give run folders, dataset folders and spec files that exist")
    token = new_token()
    prefix = new_prefix()  # the pages' path, and the cookie's: another server on this host never gets it
    dash = Dashboard(RunIndex(roots), token, data_folders=data, spec_files=spec, prefix=prefix)
    sock = open_socket(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}{prefix}/?token={token}"
    typer.echo(f"lorapod ui: {url}", err=False)
    err.print("[dim]the token in the address is the key; Ctrl-C stops the dashboard (your runs go on)[/]")
    opener = None
    if open_browser:
        import webbrowser

        opener = opener_file(url, bound)  # the browser's argv holds this file's name, never the token
        webbrowser.open(opener.as_uri())
    try:
        serve_forever(dash, sock)
    finally:
        if opener is not None:
            opener.unlink(missing_ok=True)


#: How long the file ``--open`` hands the browser holds the token.
OPENER_S = 120.0


def opener_file(url: str, port: int) -> Path:
    """A page only this user can read (0600, in a 0700 folder of LORAPOD_HOME) that sends the
    browser on to ``url``. ``--open`` gives the browser this file's name: a browser's command line
    is readable by every local user (/proc/PID/cmdline), and the token in it was too. The file is
    removed after :data:`OPENER_S` seconds, and when the dashboard stops."""
    import html
    import os
    import threading

    from lorapod.home import lorapod_home

    folder = lorapod_home() / "ui"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / f"open-{port}.html"
    target = html.escape(url, quote=True)
    page = (f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={target}">'
            f'<meta name="referrer" content="no-referrer"><title>lorapod ui</title><a href="{target}">lorapod ui</a>\n')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(page)
    timer = threading.Timer(OPENER_S, lambda: path.unlink(missing_ok=True))
    timer.daemon = True
    timer.start()
    return path


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
