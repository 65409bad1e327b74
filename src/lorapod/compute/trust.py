"""What lorapod accepts from a rented machine: the one policy for everything that comes back.

A Vast.ai host is a third party with root on the box, and a trainer may leave odd files by
accident, so nothing from the instance is trusted to be what it says:

* **Pulls take only regular files and folders inside the run folder.** rsync runs with
  ``-rt`` (recurse, times) and never ``-a``: no ``-l`` (symlinks are skipped, never recreated
  here), no ``-D`` (devices, FIFOs and sockets are skipped), no owners or permissions; rsync's
  receiver already refuses absolute and ``..`` names. ``--protect-args`` (``-s``) keeps file
  names away from the remote shell. After every pull :func:`scrub_tree` removes anything in the
  local run folder that is not a regular file or folder, whatever put it there.
* **Nothing on the instance opens a file that is not regular.** Every shell read goes through
  :func:`read_guard` (``[ -f P ] && [ ! -h P ]``), the checksum script (:data:`MANIFEST_PY`)
  ``lstat``s and opens with ``O_NOFOLLOW | O_NONBLOCK``, so a FIFO cannot block the controller.
* Names from the instance (the remote checksum list) must be plain relative paths
  (:func:`safe_relpath`).

Loading what was pulled is the engine's side of the same promise: checkpoints hold tensors in
safetensors and everything else in JSON (:mod:`lorapod.engine.checkpoint`), so no pickle from the
host is ever run, and logs are appended with ``O_NOFOLLOW`` (:func:`lorapod.fsutil.append_text`).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

#: rsync options for every transfer, both ways (see the module docstring for why not ``-a``).
RSYNC_BASE = ("-rt", "--protect-args", "--partial-dir=.rsync-partial", "--stats")


def read_guard(path: str) -> str:
    """A shell condition that is true only for a regular file that is not a symlink."""
    q = shlex.quote(path)
    return f"[ -f {q} ] && [ ! -h {q} ]"


def guarded_read(command: str, path: str) -> str:
    """``command path`` only when ``path`` is a regular file (nothing printed otherwise)."""
    return f"{{ {{ {read_guard(path)} && {command} {shlex.quote(path)} 2>/dev/null; }} || true; }}"


def safe_relpath(name: str) -> bool:
    """A name the instance reported: relative, no ``..``, no empty or odd parts."""
    if not name or name.startswith("/") or "\0" in name or "\\" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def scrub_tree(root: Path) -> list[str]:
    """Remove everything under ``root`` that is not a regular file or a folder; returns their names.

    Symlinks are removed as links (never followed), so nothing outside ``root`` is touched.
    """
    removed: list[str] = []
    if not root.is_dir() or root.is_symlink():
        return removed
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                continue
            try:
                os.unlink(p)
            except OSError:
                continue
            removed.append(os.path.relpath(p, root))
        dirnames[:] = [d for d in dirnames if os.path.isdir(os.path.join(dirpath, d))
                       and not os.path.islink(os.path.join(dirpath, d))]
    return removed


def is_regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


MANIFEST_PY = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
skip_dirs = ('.tmp-', '.old-', '.rsync-partial', '__pycache__')
out = {}
for dp, dns, fns in os.walk(root, followlinks=False):
    dns[:] = [d for d in dns if not d.startswith(skip_dirs)]
    for fn in fns:
        if fn == 'STOP' or fn.startswith('.'):
            continue
        p = os.path.join(dp, fn)
        if dp == root and fn in ('spec.yaml', 'remote-events.log', 'job.log', 'watchdog.log'):
            continue
        try:
            if not stat.S_ISREG(os.lstat(p).st_mode):
                continue  # links, FIFOs, sockets, devices: never opened, never pulled
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, 'rb') as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            h = hashlib.sha256()
            size = 0
            for chunk in iter(lambda: fh.read(1 << 20), b''):
                h.update(chunk)
                size += len(chunk)
        out[os.path.relpath(p, root)] = [size, h.hexdigest()]
print(json.dumps(out))
"""
