"""A host whose Python is bare (a fresh virtualenv holding only torch, as GPU images ship), with
this machine's package index settings and warm caches: shared by the tests and the bench."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

PIP_KEYS = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL", "find-links": "PIP_FIND_LINKS",
            "cert": "PIP_CERT"}


def pip_index_settings() -> dict[str, str]:
    """This machine's pip index settings as environment variables (sshd gives sessions a clean
    environment, so the loopback instance gets them the way an image would have them)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in PIP_KEYS:
            found[PIP_KEYS[name]] = value.strip().strip("'\"")
    return found


def index_reachable(settings: dict[str, str]) -> str | None:
    """None when the main index answers; else why not (the tests skip with it)."""
    url = settings.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/pip/"
    ctx = ssl.create_default_context(cafile=settings.get("PIP_CERT")) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, timeout=15, context=ctx) as r:
            r.read(100)
        return None
    except Exception as exc:
        return f"no package index reachable from this machine ({url}: {exc})"


def caches() -> dict[str, str]:
    """The machine's own uv and pip caches: a cold host with a warm package cache."""
    out = {}
    pip_cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    if pip_cache.returncode == 0 and pip_cache.stdout.strip():
        out["PIP_CACHE_DIR"] = pip_cache.stdout.strip()
    if shutil.which("uv"):
        uv_cache = subprocess.run(["uv", "cache", "dir"], capture_output=True, text=True)
        if uv_cache.returncode == 0 and uv_cache.stdout.strip():
            out["UV_CACHE_DIR"] = uv_cache.stdout.strip()
    return out


def setenv_line(env: dict[str, str]) -> str:
    return "SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items())


def make_bare_python(d: Path) -> str:
    """``d``: a virtualenv with this machine's torch build and nothing else; returns its python."""
    import torch

    base = getattr(sys, "_base_executable", sys.executable)
    wheels = sorted(Path("/opt/wheels").glob(f"torch-{torch.__version__}-*.whl"))
    want = str(wheels[0]) if wheels else f"torch=={torch.__version__.split('+')[0]}"
    env = {**os.environ, **pip_index_settings()}
    if shutil.which("uv"):
        steps = [["uv", "venv", "-q", "--seed", "--python", base, str(d)],
                 ["uv", "pip", "install", "-q", "--python", str(d / "bin" / "python"), want]]
    else:
        steps = [[base, "-m", "venv", str(d)], [str(d / "bin" / "python"), "-m", "pip", "install", "-q", want]]
    for cmd in steps:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed: {out.stderr[-2000:]}")
    probe = subprocess.run([str(d / "bin" / "python"), "-c", "import torch\ntry:\n import transformers\n"
                            "except ImportError: print('bare')"], capture_output=True, text=True)
    if probe.stdout.strip() != "bare":
        raise RuntimeError(f"{d} is not bare: {probe.stdout} {probe.stderr[-500:]}")
    return str(d / "bin" / "python")
