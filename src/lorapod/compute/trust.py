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
import shutil
import stat
from pathlib import Path
from typing import IO

from lorapod.rundir.layout import STOP

#: rsync options for every transfer, both ways (see the module docstring for why not ``-a``).
RSYNC_BASE = ("-rt", "--protect-args", "--partial-dir=.rsync-partial", "--stats")


def read_guard(path: str) -> str:
    """A shell condition that is true only for a regular file that is not a symlink."""
    q = shlex.quote(path)
    return f"[ -f {q} ] && [ ! -h {q} ]"


def guarded_read(command: str, path: str) -> str:
    """``command path`` only when ``path`` is a regular file (nothing printed otherwise)."""
    return f"{{ {{ {read_guard(path)} && {command} {shlex.quote(path)} 2>/dev/null; }} || true; }}"


def tail_after(path: str, offset: int, limit: int) -> str:
    """Shell printing at most ``limit`` bytes of ``path`` after byte ``offset`` (nothing when it is
    not a regular file): the one remote tail, for the controller's poll, ``lorapod logs`` and the
    dashboard's live chart (:meth:`lorapod.compute.remote.RemoteWork.tail`)."""
    return f"{guarded_read(f'tail -c +{int(offset) + 1}', path)} | head -c {int(limit)}"


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


#: The run folder's files as both remote lists see them (the checksum list below and the pull's
#: size list, compute/pulls.py SIZES_PY): one walker, so the two never skip different files.
#: Standard library only; never follows links; ``TOP_SKIP`` may be widened by the script using it.
RUN_FILES_PY = f"STOP = {STOP!r}\n" + r"""
import json, os, stat, sys
root = sys.argv[1]
SKIP_DIRS = ('.tmp-', '.old-', '.rsync-partial', '__pycache__')
TOP_SKIP = ('spec.yaml', 'remote-events.log', 'job.log', 'watchdog.log')
def run_files(top_skip=TOP_SKIP):
    for dp, dns, fns in os.walk(root, followlinks=False):
        dns[:] = [d for d in dns if not d.startswith(SKIP_DIRS)]
        for fn in fns:
            if fn == STOP or fn.startswith('.') or (dp == root and fn in top_skip):
                continue
            yield os.path.join(dp, fn)
"""

MANIFEST_PY = RUN_FILES_PY + r"""
import hashlib
out = {}
for p in run_files():
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


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """rsync's reading of ``--exclude`` for the patterns lorapod uses: ``/name`` is anchored at the
    transfer's root, any other pattern matches one path component (a matched folder takes its
    whole subtree with it); shell wildcards as in fnmatch."""
    import fnmatch

    parts = rel.split("/")
    for pat in patterns:
        if pat.startswith("/"):
            anchored = pat[1:].split("/")
            if len(parts) >= len(anchored) and all(fnmatch.fnmatchcase(p, a)
                                                   for p, a in zip(parts[: len(anchored)], anchored, strict=True)):
                return True
        elif any(fnmatch.fnmatchcase(p, pat) for p in parts):
            return True
    return False


def receive_tar(stream: IO[bytes], dest: Path, excludes: tuple[str, ...] = ()) -> tuple[int, int, list[str]]:
    """Unpack a tar stream from the instance into ``dest`` by the same rules as an rsync pull.

    Only regular files and folders, under plain relative names (:func:`safe_relpath`), are
    written, never through a link (each folder on the way is ``lstat``ed; files are opened with
    ``O_NOFOLLOW`` and renamed into place); links, devices, FIFOs and odd names are refused by
    name, as CPython's ``tarfile`` ``data`` filter (PEP 706) would refuse them, and stricter (no
    links at all). Returns (files written, bytes written, refused names)."""
    import tarfile

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = size = 0
    refused: list[str] = []
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")
    except tarfile.ReadError:
        return 0, 0, refused  # an empty stream: nothing there (yet)
    with tar:
        for m in tar:
            name = m.name.removeprefix("./").rstrip("/")
            if name in ("", "."):
                continue
            if not safe_relpath(name):
                refused.append(name[:200])
                continue
            if excluded(name, excludes):
                continue
            if not (m.isreg() or m.isdir()):
                refused.append(name)
                continue
            target = dest.joinpath(*name.split("/"))
            if not _folders_are_real(dest, name.split("/")[:-1 if m.isreg() else None]):
                refused.append(name)
                continue
            if m.isdir():
                continue
            src = tar.extractfile(m)
            tmp = target.with_name(f".lp-tar-{os.getpid()}-{target.name}"[:250])
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)  # type: ignore[arg-type]
            os.utime(tmp, (m.mtime, m.mtime))
            if target.is_symlink() or (target.exists() and not target.is_file()):
                refused.append(name)
                os.unlink(tmp)
                continue
            os.replace(tmp, target)
            files += 1
            size += m.size
    return files, size, refused


def _folders_are_real(root: Path, parts: list[str]) -> bool:
    """Make (or find) each folder of ``parts`` under ``root``; False when one is not a real folder."""
    here = root
    for part in parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            os.mkdir(here, 0o755)
            continue
        if not stat.S_ISDIR(mode):
            return False
    return True
