"""Reading files inside a run folder without ever leaving it.

A run folder holds what a rented host sent (invariant 6 of docs/design: the instance is
untrusted), so a name from a URL is walked one component at a time with ``O_NOFOLLOW`` from a
descriptor of the run folder itself: ``..``, absolute names, empty or hidden components and any
symbolic link on the way are refused, and only a regular file is opened. Listings use
``lstat`` (``follow_symlinks=False``), so a planted link is neither listed nor followed. The same
policy as the pull's (``compute/trust.py``): regular files inside the run folder only.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: What the dashboard serves from a run folder, by suffix; anything else is not served at all.
#: No HTML or SVG: a host could put script in them.
MEDIA_TYPES = {
    ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif",
    ".mp4": "video/mp4", ".webm": "video/webm",
}
#: Text files are read for pages (escaped there), never served raw, and only up to this size.
TEXT_LIMIT = 256 * 1024


class Refused(Exception):
    """A name that points outside the run folder, through a link, or at something not a file."""


def _parts(rel: str) -> list[str]:
    if not rel or "\\" in rel or "\0" in rel or rel.startswith("/"):
        raise Refused(rel)
    parts = rel.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise Refused(rel)
    return parts


def open_inside(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``rel`` inside ``root``; Refused otherwise."""
    parts = _parts(rel)
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Refused(rel) from exc
    try:
        for name in parts[:-1]:
            nxt = os.open(name, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                      dir_fd=fd)
    except OSError as exc:  # ELOOP for a link, ENOTDIR, ENOENT
        raise Refused(rel) from exc
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise Refused(rel)
    return out


@dataclass(frozen=True)
class Served:
    fd: int
    size: int
    media_type: str


def serve(root: Path, rel: str) -> Served:
    """A run-folder file the browser may load (images, clips); Refused for anything else."""
    media = MEDIA_TYPES.get(os.path.splitext(rel)[1].lower())
    if media is None:
        raise Refused(rel)
    fd = open_inside(root, rel)
    return Served(fd, os.fstat(fd).st_size, media)


def read_text(root: Path, rel: str, limit: int = TEXT_LIMIT, tail: bool = False) -> str | None:
    """A text file's first (or, with ``tail``, last) ``limit`` bytes, decoded; None if absent or refused."""
    try:
        fd = open_inside(root, rel)
    except Refused:
        return None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if tail and size > limit:
            fh.seek(size - limit)
            data = fh.read(limit)
            data = data[data.find(b"\n") + 1:]  # from the first whole line
        else:
            data = fh.read(limit)
    return data.decode("utf-8", errors="replace")


def read_from(root: Path, rel: str, offset: int, limit: int = 4 * 1024 * 1024) -> tuple[bytes, int]:
    """Whole lines of ``rel`` after byte ``offset`` (at most ``limit`` bytes) and the new offset.
    A file that shrank (a resume truncates metrics.jsonl) starts again from 0. A line longer than
    ``limit`` is passed over, ``limit`` bytes at a time (its rest reads as a torn line and is
    dropped by the parser): before, a 5 MB line froze a page's live chart for good."""
    try:
        fd = open_inside(root, rel)
    except Refused:
        return b"", offset
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < offset:
            offset = 0
        fh.seek(offset)
        data = fh.read(limit)
    cut = data.rfind(b"\n")
    if cut < 0:
        if len(data) >= limit:  # one line longer than a whole read: skip it, or every later read stops here
            return b"", offset + len(data)
        return b"", offset
    return data[: cut + 1], offset + cut + 1


def sample_lines(root: Path, rel: str, tail: int, windows: int, window: int) -> tuple[bytes, int, int, bool]:
    """Bounded reading of a text file of any size: all of it when it is at most ``tail`` bytes;
    else its last ``tail`` bytes and ``windows`` stretches of ``window`` bytes spread evenly over
    the rest, each cut to whole lines. Returns the lines, the offset after the last whole line,
    the file's size and whether it was sampled. At most ``tail + windows * window`` bytes are
    read, whatever the host wrote (a 100 MB metrics.jsonl took 5-7 s and ~600 MB per request)."""
    try:
        fd = open_inside(root, rel)
    except Refused:
        return b"", 0, 0, False
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= tail:
            data = fh.read(size)
            cut = data.rfind(b"\n") + 1
            return data[:cut], cut, size, False
        head_end = size - tail
        parts = []
        step = head_end / windows
        for i in range(windows):
            start = int(i * step)
            fh.seek(start)
            chunk = fh.read(min(window, head_end - start))
            if start:
                chunk = chunk[chunk.find(b"\n") + 1:] if b"\n" in chunk else b""
            parts.append(chunk[: chunk.rfind(b"\n") + 1])
        fh.seek(head_end)
        raw = fh.read(tail)
    first = raw.find(b"\n") + 1  # the tail from its first whole line
    cut = raw.rfind(b"\n") + 1  # to its last
    if first and cut > first:
        parts.append(raw[first:cut])
    return b"".join(parts), head_end + cut if cut else size, size, True


def list_files(root: Path, rel: str) -> list[tuple[str, int, float]]:
    """(name, size, mtime) of the regular files directly in ``root/rel``, links left out."""
    try:
        parts = _parts(rel) if rel else []
    except Refused:
        return []
    here = root
    for p in parts:  # every folder on the way must be a real folder, not a link
        here = here / p
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return []
        except OSError:
            return []
    out = []
    try:
        with os.scandir(here) as it:
            for e in it:
                if e.name.startswith(".") or not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
                out.append((e.name, st.st_size, st.st_mtime))
    except OSError:
        return []
    return sorted(out)


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
