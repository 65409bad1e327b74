"""What a pull from the instance may bring to this machine: bounded, sparse-aware, checked for space.

The instance decides what lies in its run folder; the pull writes it on this machine's disk. So
before every pull (one round trip, :data:`SIZES_PY`) lorapod learns each file's size and how much
of it is really on the instance's disk, and then:

* a **sparse** file (apparent size far above its allocated blocks: a 2 GB file of holes costs the
  host nothing and arrived here dense) is left on the instance and named; a trainer writes none;
* the total is held to a **cap**: ``output.max_pull_gb`` in the spec, else
  :data:`CAP_MARGIN` times the planner's estimate of what is pulled (checkpoints x adapter size:
  ``plan.job.Job.pull_gb``; the estimate leaves out optimizer states and samples, hence the
  margin) plus :data:`CAP_FLOOR_GB`. Over it, only the newest checkpoint and the adapter come;
* **free space here** is checked first: what is new must fit with :data:`RESERVE_BYTES` to
  spare, else :class:`LocalDiskFull`, which says that it is this machine's disk, how much is
  needed and where; an rsync that still runs out of space here (``write failed ... No space
  left on device``) is turned into the same error.

The smallest set that resumes is the newest ``checkpoints/step-N`` plus ``adapter/`` and the small
files (metrics, plan, events): :meth:`PullGuard.pull` with ``newest_only`` pulls just that, which is
what a full disk gets first.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.compute.remote import PULL_EXCLUDES
from lorapod.compute.transport import SyncStats
from lorapod.compute.trust import RUN_FILES_PY, safe_relpath
from lorapod.errors import RemoteError

if TYPE_CHECKING:
    from lorapod.spec import JobSpec

#: Size and allocated bytes of every regular file of the run folder, walked as the checksum list
#: walks it (compute/trust.py RUN_FILES_PY; env.log is left out of the sizes too).
SIZES_PY = RUN_FILES_PY + r"""
out = {}
for p in run_files(TOP_SKIP + ('env.log',)):
    try:
        st = os.lstat(p)
    except OSError:
        continue
    if stat.S_ISREG(st.st_mode):
        out[os.path.relpath(p, root)] = [st.st_size, getattr(st, 'st_blocks', st.st_size // 512) * 512]
print(json.dumps(out))
"""

RESERVE_BYTES = 256 << 20  # left free here after a pull: logs, the ledger, the next checkpoint's metadata
CAP_MARGIN = 10.0
CAP_FLOOR_GB = 2.0
SPARSE_MIN_BYTES = 16 << 20  # smaller files are never called sparse
_STEP = re.compile(r"checkpoints/(step|epoch)-(\d+)/")


class LocalDiskFull(RemoteError):
    """This machine's disk cannot hold what the pull brings."""

    def __init__(self, folder: Path, needed: int, free: int) -> None:
        self.folder, self.needed, self.free = folder, needed, free
        super().__init__(
            f"this machine's disk is full: {folder} has {_mb(free)} free, and the results on the instance "
            f"need {_mb(needed)} more (plus {_mb(RESERVE_BYTES)} to spare)",
            hint=f"free at least {_mb(needed + RESERVE_BYTES - free)} on the disk holding {folder} "
                 "(old run folders, caches), then `lorapod pull JOB`")


def _mb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{max(0, n) / 2**20:.0f} MiB"


def _pattern(rel: str) -> str:
    """An rsync exclude matching exactly ``/rel`` (wildcards in a host's file name escaped)."""
    return "/" + re.sub(r"([*?\[\\])", r"\\\1", rel)


@dataclass
class RemoteFiles:
    """The instance's run folder as sizes: ``{relative path: (bytes, bytes allocated)}``."""

    files: dict[str, tuple[int, int]]

    def sparse(self) -> list[str]:
        return sorted(k for k, (size, alloc) in self.files.items() if size >= SPARSE_MIN_BYTES and alloc < size // 2)

    def newest_checkpoint(self) -> str | None:
        steps = {m.group(0) for k in self.files if (m := _STEP.match(k))}
        return max(steps, key=lambda s: int(_STEP.match(s).group(2)), default=None)  # type: ignore[union-attr]

    def older_checkpoints(self) -> list[str]:
        newest = self.newest_checkpoint()
        return sorted({m.group(0) for k in self.files if (m := _STEP.match(k))} - {newest} if newest else set())

    def beyond_newest(self) -> list[str]:
        """Top-level folders other than the newest checkpoint and the adapter (samples, tensorboard):
        left for later when only the smallest set that resumes is pulled. The quality autopilot's
        folder always comes (small: its scores and decision are what a resumed run continues from)."""
        tops = {k.split("/", 1)[0] + "/" for k in self.files if "/" in k}
        return sorted(tops - {"checkpoints/", "adapter/", "quality/"})


def remote_files(work: Any, python: str) -> RemoteFiles:
    out = work.sh(f"{shlex.quote(python)} - {work.q('run')}", input=SIZES_PY.encode(), timeout=600)
    try:
        raw = json.loads((out.stdout.decode(errors="replace").strip().splitlines() or ["{}"])[-1])  # after a banner
    except ValueError as exc:
        raise RemoteError(f"the instance's list of result files is not JSON ({exc})") from exc
    files: dict[str, tuple[int, int]] = {}
    for k, v in raw.items() if isinstance(raw, dict) else ():
        if (safe_relpath(k) and isinstance(v, list) and len(v) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63 for x in v)):
            files[k] = (v[0], v[1])
    return RemoteFiles(files)


def _left(rel: str, left: set[str]) -> bool:
    return any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in left)


def _local_size(root: Path, rel: str) -> int | None:
    try:
        return (root / rel).stat().st_size
    except OSError:
        return None


@dataclass
class PullGuard:
    """Every pull of one job goes through here (compute/follow.py calls :meth:`pull`)."""

    work: Any
    run_root: Path
    python: str
    cap_bytes: int | None
    say: Callable[[str], None]
    skipped: set[str] = field(default_factory=set)  # left on the instance on purpose: not verified
    _said: set[str] = field(default_factory=set)

    def _once(self, key: str, msg: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(msg)

    def leaves(self, rel: str) -> bool:
        """Whether ``rel`` was left on the instance on purpose (the final check skips it)."""
        return _left(rel, self.skipped)

    def pull(self, why: str, newest_only: bool = False) -> SyncStats:
        files = remote_files(self.work, self.python)
        left: set[str] = set(files.sparse())
        if left:
            total = sum(files.files[k][0] for k in left)
            self._once("sparse", f"left {len(left)} sparse file(s) on the instance ({_mb(total)} of holes, "
                                 f"e.g. {sorted(left)[0]}): a trainer writes none, and they would arrive dense")
        total = sum(size for k, (size, _) in files.files.items() if k not in left)
        over_cap = self.cap_bytes is not None and total > self.cap_bytes
        if over_cap:
            self._once("cap", f"the results on the instance ({_mb(total)}) pass the pull cap of {_mb(self.cap_bytes or 0)} "
                              "(output.max_pull_gb, or 10x the planner's estimate): pulling only the newest "
                              "checkpoint and the adapter")
        if newest_only or over_cap:
            left |= set(files.older_checkpoints()) | set(files.beyond_newest())
        # a changed file is written whole beside the old one, then renamed: count its full size
        need = sum(size for k, (size, _) in files.files.items()
                   if not _left(k, left) and _local_size(self.run_root, k) != size)
        free = shutil.disk_usage(self.run_root).free
        if need + RESERVE_BYTES > free:
            raise LocalDiskFull(self.run_root, need, free)
        self.skipped = left
        excludes = (*PULL_EXCLUDES, *(_pattern(k.rstrip("/")) for k in sorted(left)))
        try:
            return self.work.transport.pull(f"{self.work.dir}/run", self.run_root, excludes=excludes)
        except RemoteError as exc:
            if "No space left" in exc.message or "Disk quota exceeded" in exc.message:
                raise LocalDiskFull(self.run_root, need, shutil.disk_usage(self.run_root).free) from exc
            raise


def cap_bytes(spec: JobSpec, plan_pull_gb: float | None) -> int | None:
    """The pull cap: ``output.max_pull_gb``, else a margin over the planner's estimate, else none."""
    set_gb = getattr(spec.output, "max_pull_gb", None)
    if set_gb:
        return int(float(set_gb) * 1e9)
    if plan_pull_gb:
        return int((CAP_MARGIN * float(plan_pull_gb) + CAP_FLOOR_GB) * 1e9)
    return None

