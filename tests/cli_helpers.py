"""The CLI in-process, as a user's shell would see it: exit code, stdout, stderr."""

from __future__ import annotations

import lorapod.cli.main as cli_main


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``lorapod ARGS`` through the real entry point (its error handling included)."""
    try:
        cli_main.main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
