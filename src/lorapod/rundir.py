"""The run folder: one per job, laid out the same locally and on a rented instance.

```
runs/<job-id>/
  spec.yaml       the resolved spec (no secrets)
  plan.json       what the planner predicted (when planned)
  metrics.jsonl   one JSON object per step / eval
  device.json     where the steps were timed: device type, GPU name, processes (engine runs)
  checkpoints/    step-N/ (atomic: written to a tmp folder, then renamed)
  samples/        generations or images per checkpoint
  adapter/        the final adapter in PEFT format (exports beside it)
  events.log      human-readable lifecycle log
```

Remote runs pull into the same layout, so every local tool (eval, export, resume) works on a
pulled run exactly as on a local one.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from lorapod.errors import LorapodError
from lorapod.fsutil import append_text, atomic_write_text


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
    metrics_file = property(lambda self: self.root / "metrics.jsonl")
    checkpoints = property(lambda self: self.root / "checkpoints")
    samples = property(lambda self: self.root / "samples")
    adapter = property(lambda self: self.root / "adapter")
    events_file = property(lambda self: self.root / "events.log")
    device_file = property(lambda self: self.root / "device.json")
    tensorboard = property(lambda self: self.root / "tensorboard")
    trainer_file = property(lambda self: self.root / "trainer.json")

    def write_spec(self, spec) -> None:
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
