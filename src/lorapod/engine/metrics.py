"""Training metrics: one JSON object per line in ``metrics.jsonl``, mirrored to the live trackers.

JSONL is the source of truth (remote runs follow and pull it line by line); the trackers
(TensorBoard, W&B: :mod:`lorapod.engine.trackers`) are views of it, and one that fails is
switched off with a warning instead of ending the run.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


class MetricsWriter:
    def __init__(self, path: Path, tensorboard_dir: Path | None = None, resume_step: int | None = None,
                 trackers: list | None = None, event=lambda message: None) -> None:
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self._fh = open(self.path, "a", encoding="utf-8")
        self.trackers = list(trackers or [])
        self._event = event
        self._seen: set[str] | None = None  # sample files already logged (those of before a resume too)
        if tensorboard_dir is not None:
            try:
                from lorapod.engine.trackers import TensorBoardTracker

                self.trackers.append(TensorBoardTracker(tensorboard_dir))
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines logged after the checkpoint so the curve has no duplicates."""
        from lorapod.rundir.metrics import MetricsFeed

        feed, kept = MetricsFeed(), []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            rec = feed.accept(line)  # a torn last line from a crash is dropped, as every reader drops it
            if rec is not None and rec["step"] <= step:
                kept.append(line)
        self.path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **{k: _clean(v) for k, v in record.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self.trackers and record.get("event") in (None, "eval"):
            from lorapod.engine.trackers import scalars

            values = scalars(record)
            if values:
                self._each(lambda t: t.log(values, int(record.get("step", 0))))

    def samples(self, folder: Path, step: int) -> None:
        """Send the sample files that appeared in ``folder`` since the last call to the trackers
        (the first call only notes what is there: a resumed run's old samples were sent before)."""
        if not self.trackers:
            return
        from lorapod.engine.trackers import ANSWER_EXT, IMAGE_EXTS, VIDEO_EXTS

        kinds = (*IMAGE_EXTS, *VIDEO_EXTS, ANSWER_EXT)
        files = sorted(p for p in Path(folder).glob("*") if p.is_file() and p.suffix.lower() in kinds) \
            if Path(folder).is_dir() else []
        if self._seen is None:
            self._seen = {p.name for p in files}
            return
        for p in files:
            if p.name not in self._seen:
                self._seen.add(p.name)
                self._each(lambda t, p=p: t.sample(p, step))

    def _each(self, call) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # a tracker is a view: it never ends the run (metrics.jsonl has it all)
                self.trackers.remove(tracker)
                msg = f"{tracker.name}: stopped logging ({type(exc).__name__}: {str(exc)[:200]}); metrics.jsonl has it all"
                warnings.warn(msg, stacklevel=3)
                self._event(msg)

    def close(self) -> None:
        """Idempotent: the loop closes early to plot, and again in its ``finally``."""
        if self._fh.closed:
            return
        self._fh.close()
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as exc:
                self._event(f"{tracker.name}: close failed ({type(exc).__name__}: {str(exc)[:200]})")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The valid records of a metrics file, by the one reader (:func:`lorapod.rundir.metrics.read_records`:
    a torn or foreign line is dropped, never fatal)."""
    from lorapod.rundir.metrics import read_records

    return read_records(Path(path))
