"""Files that several writers may make at once: the installation id and atomic writes.

A sweep starts its jobs from threads of one process, each asking for the installation id (it goes
into every instance label) on a fresh lorapod home; a temporary file named by the pid alone was
shared by those threads, and one removed it before the other's link (a sweep job failed with
FileNotFoundError under load). Each writer now has its own temporary file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from lorapod.fsutil import atomic_write_text
from lorapod.store import identity


def _in_threads(fn, n: int = 2) -> list:
    """Run ``fn`` in ``n`` threads that start together; their results, or the exceptions raised."""
    start, out = threading.Barrier(n), [None] * n

    def one(i: int) -> None:
        start.wait()
        try:
            out[i] = fn()
        except Exception as exc:  # the test reports it
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_threads_asking_for_the_installation_id_at_once_get_one_id(monkeypatch):
    """Every thread gets the same id, and no two used the same temporary file (each link's source
    is recorded; the link waits for the other thread, so both temporaries exist at once)."""
    sources: list[str] = []
    both_there = threading.Barrier(2)
    real_link = os.link

    def link(src, dst, *a, **kw):
        sources.append(str(src))
        both_there.wait(timeout=10)  # both threads have written their temporary file
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(identity.os, "link", link)
    ids = _in_threads(identity.installation_id)
    assert not [x for x in ids if isinstance(x, Exception)], ids
    assert len(set(ids)) == 1 and len(ids[0]) == 8
    assert len(set(sources)) == 2, f"two writers shared one temporary file: {sources}"
    home = Path(os.environ["LORAPOD_HOME"])
    assert [p.name for p in home.iterdir() if p.name.startswith(".installation-id")] == []
    assert identity.installation_id() == ids[0]


def test_threads_writing_one_file_atomically_never_share_a_temporary(tmp_path, monkeypatch):
    """Two threads replace one file at once: each rename finds its own temporary file, and the
    file ends as one writer's whole text."""
    import lorapod.fsutil as fsutil

    renames: list[str] = []
    both_there = threading.Barrier(2)
    real_replace = os.replace

    def replace(src, dst):
        renames.append(str(src))
        both_there.wait(timeout=10)
        return real_replace(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", replace)
    target = tmp_path / "state.json"
    texts = iter(["a" * 1000, "b" * 1000])
    lock = threading.Lock()

    def write() -> None:
        with lock:
            text = next(texts)
        atomic_write_text(target, text)

    out = _in_threads(write)
    assert not [x for x in out if isinstance(x, Exception)], out
    assert len(set(renames)) == 2, f"two writers shared one temporary file: {renames}"
    assert target.read_text() in ("a" * 1000, "b" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
