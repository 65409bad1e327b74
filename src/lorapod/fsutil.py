"""Small file-system primitives that never leave a half-written file looking whole."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def writer_tag() -> str:
    """``PID-THREAD``: the part of a temporary name that is this writer's alone. The pid alone is
    not enough: a sweep runs its jobs from threads of one process, and two threads sharing a
    temporary name remove each other's file."""
    return f"{os.getpid()}-{threading.get_ident()}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to ``.NAME.tmp-``:func:`writer_tag` then rename over ``path``: readers see the old or
    the new file, and two writers (processes or threads) never share a temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{writer_tag()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success rename it to ``final`` (replacing it).

    On any error the temporary folder is removed and ``final`` is left as it was, so a
    checkpoint or adapter folder either exists whole or not at all.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{writer_tag()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        file_mode = 0o666 & ~umask()
        for f in tmp.rglob("*"):
            if f.is_file() and not f.is_symlink():
                # safetensors (0.8 here) writes its files 0600, as a private temp file would be: an
                # adapter or merged model is an output like any other, readable as the umask allows.
                mode = f.stat().st_mode & 0o777
                if mode & 0o111 == 0 and mode != file_mode:
                    f.chmod(file_mode)
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.with_name(f".old-{final.name}-{writer_tag()}")
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore (the only portable way before Python 3.13)
    os.umask(old)
    return old


def append_text(path: Path, text: str, sync: bool = False) -> None:
    """Append ``text`` to a log file, never through a symlink, never into a FIFO or device.

    A run folder may come back from a rented machine; a log there that is a link (to a file of
    yours, say) or a FIFO is replaced by a fresh regular file instead of being written through.
    """
    import stat

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        os.unlink(path)  # a link, FIFO or other non-regular entry: drop it, never follow it
        fd = os.open(path, flags | os.O_EXCL, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())


def sha256_file(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB pieces: a checkpoint's manifest (engine/checkpoint.py)
    and the controller's check of a pulled checkpoint against it (compute/recovery.py)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
