"""Where lorapod keeps its own state: ``$LORAPOD_HOME`` (default ``~/.lorapod``).

Holds the ledger, the config file with API keys (0600), built-in models and caches. Tests point
it at a temporary folder so they never touch a user's real state.
"""

from __future__ import annotations

import os
from pathlib import Path


def lorapod_home() -> Path:
    home = Path(os.environ.get("LORAPOD_HOME") or Path.home() / ".lorapod").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def offline() -> bool:
    """True when the Hugging Face Hub must not be contacted (HF_HUB_OFFLINE, LORAPOD_OFFLINE) (read at call time, not at import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no") or (
        os.environ.get("LORAPOD_OFFLINE") == "1"
    )
