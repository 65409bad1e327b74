"""The run folder: one per job, laid out the same locally and on a rented instance.

```
runs/<job-id>/
  spec.yaml       the resolved spec (no secrets)
  plan.json       what the planner predicted (when planned)
  metrics.jsonl   one JSON object per step / eval (read through rundir/metrics.py, the one reader)
  STOP            present while a stop at the next save is asked for (rundir/layout.py: the names)
  device.json     where the steps were timed: device type, GPU name, processes (engine runs)
  checkpoints/    step-N/ (atomic: written to a tmp folder, then renamed)
  samples/        generations or images per checkpoint
  adapter/        the final adapter in PEFT format (exports beside it)
  events.log      human-readable lifecycle log
  .lock           who writes this folder now (pid, host, command); empty once released
```

Remote runs pull into the same layout, so every local tool (eval, export, resume) works on a
pulled run exactly as on a local one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lorapod.errors import LorapodError
from lorapod.fsutil import append_text, atomic_write_text
from lorapod.rundir.layout import (
    CHECKPOINT_GLOB,
    CHECKPOINTS,
    METRICS,
    SAMPLE_EXTS,
    SAMPLES,
    STOP,
    checkpoint_name,
    checkpoint_step,
    checkpoints_by_step,
    has_checkpoints,
    last_checkpoint,
    sample_file,
    sample_parts,
    sample_step,
    sample_tag,
)
from lorapod.rundir.metrics import LOSS_KEYS, last_loss, read_records

if TYPE_CHECKING:
    from lorapod.spec import JobSpec

LOCK_NAME = ".lock"


class RunDirBusy(LorapodError):
    """Another process writes this run folder: two writers would interleave metrics and checkpoints."""


@dataclass
class WriterLock:
    """The one writer of a run folder: an exclusive ``flock`` on ``.lock``, whose text names the
    holder. The kernel drops the flock when the holder dies (even by SIGKILL), so a lock left by
    a dead process is free to take; its text still names who left it, which is how that is said."""

    path: Path
    fd: int
    holder: dict

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)  # empty: released cleanly, nothing to take over
        except OSError:
            pass
        finally:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def describe_holder(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
            f"({str(holder.get('command', '?'))[:200]}, since {holder.get('since', '?')})")


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {"command": "unreadable lock file"}
    return data if isinstance(data, dict) else {}


def new_job_id(name: str) -> str:
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-")[:40] or "job"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def create(cls, parent: str | Path, name: str) -> RunDir:
        root = Path(parent) / new_job_id(name)
        root.mkdir(parents=True, exist_ok=False)
        run = cls(root)
        for sub in (run.checkpoints, run.samples):
            sub.mkdir(exist_ok=True)
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        root = Path(path)
        if not (root / "spec.yaml").is_file():
            raise LorapodError(
                f"{root} is not a run folder (no spec.yaml in it)",
                hint="pass the folder that `lorapod train` printed, e.g. runs/my-job-20261130-101500-ab12",
            )
        return cls(root)

    @property
    def job_id(self) -> str:
        return self.root.name

    spec_file = property(lambda self: self.root / "spec.yaml")
    plan_file = property(lambda self: self.root / "plan.json")
    metrics_file = property(lambda self: self.root / METRICS)
    stop_file = property(lambda self: self.root / STOP)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    samples = property(lambda self: self.root / SAMPLES)
    adapter = property(lambda self: self.root / "adapter")
    events_file = property(lambda self: self.root / "events.log")
    device_file = property(lambda self: self.root / "device.json")
    tensorboard = property(lambda self: self.root / "tensorboard")
    trainer_file = property(lambda self: self.root / "trainer.json")

    def lock(self, command: str | None = None, say: Callable[[str], None] | None = None) -> WriterLock:
        """Become this folder's only writer, or raise :class:`RunDirBusy` naming the one that is.

        A lock left by a process that died is taken over, and ``say`` (and events.log) tells so.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirBusy(f"{self.root} is already being written by {describe_holder(holder)}",
                             hint="wait for it to finish, or stop it (Ctrl-C, `lorapod down JOB`); "
                                  "a second writer would interleave its metrics and checkpoints") from None
        left = _read_holder(fd)
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "command": command or " ".join(["lorapod", *sys.argv[1:]])[:500],
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(holder).encode())
        if left.get("pid") is not None:
            msg = f"took over the run folder's lock left by {describe_holder(left)}, which is gone"
            if say is not None:
                say(msg)
            with contextlib.suppress(OSError):  # a full disk loses the line, not the lock
                self.event(msg)
        return WriterLock(path, fd, holder)

    def checkpoints_by_step(self) -> list[tuple[int, Path]]:
        """``(step, checkpoints/step-N)``, oldest first (:func:`~lorapod.rundir.layout.checkpoints_by_step`)."""
        return checkpoints_by_step(self.checkpoints)

    def writer(self) -> dict | None:
        """Who writes this folder now, by its lock's text (:meth:`lock`): the holder while it names a
        process that is alive (or one on another host, which cannot be asked); None when the lock
        was released, never taken, or left by a process that is gone."""
        try:
            with open(self.root / LOCK_NAME, "rb") as fh:
                holder = json.loads(fh.read(4096) or b"{}")
        except (OSError, ValueError):
            return None
        if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
            return None
        if holder.get("host") != socket.gethostname():
            return holder
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
        return holder

    def request_stop(self, reason: str) -> Path:
        """Ask the job writing this folder to stop at its next save: the engine's loop and the trainer
        runner see ``STOP``, save a checkpoint and exit cleanly. Returns the file written."""
        atomic_write_text(self.stop_file, reason.strip().replace("\n", " ")[:500] + "\n")
        return self.stop_file

    def write_spec(self, spec: JobSpec) -> None:
        atomic_write_text(self.spec_file, spec.to_yaml())

    def write_trainer(self, name: str) -> None:
        """Which external trainer fills this folder, so that ``--resume`` continues with it."""
        atomic_write_text(self.trainer_file, json.dumps({"trainer": name}) + "\n")

    def recorded_trainer(self) -> str | None:
        """The external trainer this run was started with; None for lorapod's own engine."""
        if not self.trainer_file.is_file():
            return None
        try:
            name = json.loads(self.trainer_file.read_text())["trainer"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LorapodError(f"{self.trainer_file} cannot be read ({exc})",
                               hint='it holds {"trainer": "sd-scripts"} (or another trainer); fix or remove it') from exc
        if not isinstance(name, str):
            raise LorapodError(f"{self.trainer_file}: 'trainer' is not a name",
                               hint='it holds {"trainer": "sd-scripts"} (or another trainer); fix or remove it')
        return name

    def write_plan(self, plan: dict) -> None:
        atomic_write_text(self.plan_file, json.dumps(plan, indent=2, default=str))

    def write_device(self, info: dict) -> None:
        atomic_write_text(self.device_file, json.dumps(info, indent=2))

    def event(self, message: str) -> None:
        """Append one line to events.log (flushed, so a crash keeps everything before it)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        append_text(self.events_file, f"{stamp} {message}\n", sync=True)  # never through a planted link



__all__ = [
    "CHECKPOINTS",
    "CHECKPOINT_GLOB",
    "LOCK_NAME",
    "LOSS_KEYS",
    "METRICS",
    "SAMPLES",
    "SAMPLE_EXTS",
    "STOP",
    "RunDir",
    "RunDirBusy",
    "WriterLock",
    "checkpoint_name",
    "checkpoint_step",
    "checkpoints_by_step",
    "describe_holder",
    "has_checkpoints",
    "last_checkpoint",
    "last_loss",
    "new_job_id",
    "read_records",
    "sample_file",
    "sample_parts",
    "sample_step",
    "sample_tag",
]
