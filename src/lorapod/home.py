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


#: How long the hub gets to answer a TCP connect before it counts as unreachable.
HUB_CONNECT_S = 3.0
_unreachable: dict[str, str | None] = {}


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub (``HF_ENDPOINT``, default huggingface.co) cannot be reached from here,
    or None when it can (or cannot be told: behind a proxy, which only the request itself goes
    through). One TCP connect with a short deadline, once per process: without it a machine with no
    network spends ~25 s in huggingface_hub's five retries per file, printing a line each, before
    the cache is tried. Offline (:func:`offline`) is not asked here: the callers skip the hub then."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    if endpoint not in _unreachable:
        url = urlsplit(endpoint)
        host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
        try:
            socket.create_connection((host, port), timeout=HUB_CONNECT_S).close()
            _unreachable[endpoint] = None
        except OSError as exc:
            _unreachable[endpoint] = f"{host}: {exc.strerror or type(exc).__name__}"
    return _unreachable[endpoint]
