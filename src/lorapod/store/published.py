"""What ``lorapod export RUN --to hub`` published, remembered on this machine for ``lorapod deploy``.

Kept in ``$LORAPOD_HOME/published.jsonl`` (one JSON line per upload, with the run folder's
resolved path), never in the run folder: a remote run's folder is what the instance wrote and the
pull brought home (DESIGN invariant 6, the instance is untrusted), so a ``published.json`` there
could name any repo, and ``deploy`` without ``--repo`` would serve it on the user's account.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lorapod.home import lorapod_home

#: The newest lines read back (a line is ~200 bytes; years of publishing fit).
READ_LIMIT = 4 * 1024 * 1024


def _file() -> Path:
    return lorapod_home() / "published.jsonl"


def remember(run_root: Path, row: dict[str, Any]) -> None:
    """Append one upload (``repo``, ``what``: adapter | merged | gguf, ...) for ``run_root``."""
    line = json.dumps({**row, "run": str(Path(run_root).resolve())}) + "\n"
    f = _file()
    f.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, line.encode())  # one write of one line: appends from two exports do not interleave
    finally:
        os.close(fd)


def latest(run_root: Path, what: str) -> str | None:
    """The repo of the newest upload of kind ``what`` from ``run_root`` on this machine, or None."""
    run = str(Path(run_root).resolve())
    try:
        with open(_file(), "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - READ_LIMIT))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for text in reversed(lines):
        try:
            row = json.loads(text)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("run") == run and row.get("what") == what \
                and isinstance(row.get("repo"), str):
            return row["repo"]
    return None
