"""The quality autopilot's files in a run folder: their names, and the one bounded reader of them.

```
quality/
  scores.jsonl   one JSON object per scored checkpoint (its step, the scores per strength, the models)
  base.json      the base model's row: what the checkpoints' scores are differences from
  pick.json      the decision: checkpoint, strength, the scores that decided it, or why none
  stop.json      written when train.stop_when ended the run: where, why, the steps and seconds saved
  holdout.json   which images were held out as references, or why none
  renders/       small copies of the scored images (base and every checkpoint), to look at
```

They are written on the machine that trains (lorapod's engine, or the trainer runner) and pulled
home with the rest of the run folder, so the autopilot's state survives a spot preemption: a
resumed run reads the scores so far and its plateau count goes on. Like metrics.jsonl they may
come from an untrusted host: every read here is bounded (:data:`MAX_JSON_BYTES`, the metrics
reader's line rules for scores.jsonl), never through a link, and a malformed file reads as absent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lorapod.fsutil import append_text, atomic_write_text
from lorapod.rundir.metrics import MetricsFeed, number, read_bytes

QUALITY = "quality"
SCORES = "scores.jsonl"
BASE = "base.json"
PICK = "pick.json"
STOPPED = "stop.json"
HOLDOUT = "holdout.json"
RENDERS = "renders"
#: The largest quality JSON file read (a pick or a base row is a few KiB; the base's leakage
#: embeddings a few hundred).
MAX_JSON_BYTES = 4 << 20
#: The most of scores.jsonl read: its last bytes (one line per checkpoint, a few KiB each).
MAX_SCORES_BYTES = 8 << 20


def folder(root: Path) -> Path:
    return Path(root) / QUALITY


def read_json(root: Path, name: str) -> dict[str, Any] | None:
    """``quality/<name>`` as a JSON object, or None (missing, a link, too big, not an object)."""
    data = read_bytes(folder(root) / name, None)
    if not data or len(data) > MAX_JSON_BYTES:
        return None
    try:
        obj = json.loads(data, parse_constant=lambda c: None)  # NaN/Infinity read as null
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json(root: Path, name: str, obj: dict[str, Any]) -> Path:
    path = folder(root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(_finite(obj), indent=1, sort_keys=False) + "\n")
    return path


def read_scores(root: Path) -> list[dict[str, Any]]:
    """The scored checkpoints, oldest first, one per step (a step scored twice, as after a resume,
    keeps its last record). Lines follow the metrics reader's rules (rundir/metrics.py)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in read_bytes(folder(root) / SCORES, MAX_SCORES_BYTES).split(b"\n"):
        rec = MetricsFeed().accept(line)  # one line at a time: a re-scored step may follow a later one
        if rec is not None and isinstance(rec.get("strengths"), dict):
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def append_score(root: Path, record: dict[str, Any]) -> None:
    path = folder(root) / SCORES
    path.parent.mkdir(parents=True, exist_ok=True)
    append_text(path, json.dumps(_finite(record)) + "\n", sync=True)


def _finite(obj: Any) -> Any:
    """JSON without NaN or Infinity (which json.dumps writes and strict readers refuse): None instead."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def pick_summary(root: Path) -> dict[str, Any] | None:
    """What ``ps --json``, the run summary and the dashboard show of a run's decision: the checkpoint
    and strength picked (or why none), the score, and the early stop when there was one. None when
    the run has no quality files."""
    pick = read_json(root, PICK)
    if pick is None:
        return None
    out: dict[str, Any] = {key: pick.get(key) for key in ("checkpoint", "strength", "score", "reason", "autopilot")}
    out["score"] = number(out["score"])
    out["strength"] = number(out["strength"])
    for key in ("checkpoint", "reason"):
        if not isinstance(out[key], str):
            out[key] = None
        else:
            out[key] = out[key][:2000]
    stop = read_json(root, STOPPED)
    if stop is not None:
        out["stopped"] = {k: stop.get(k) for k in ("step", "reason", "planned_steps", "steps_saved", "seconds_saved")
                          if isinstance(stop.get(k), int | float | str) and not isinstance(stop.get(k), bool)}
    return out


def saved_line(stop: dict[str, Any], usd_per_hour: float | None) -> str:
    """"stopped by train.stop_when at step 300 (...): 1,200 planned steps not run, 41 min and $0.52
    saved": the early stop in words, with dollars when the hourly rate is known."""
    secs = number(stop.get("seconds_saved"))
    steps = stop.get("steps_saved")
    parts = [f"stopped by train.stop_when at step {stop.get('step')}"]
    if isinstance(stop.get("reason"), str):
        parts[0] += f" ({str(stop['reason'])[:300]})"
    saved = []
    if isinstance(steps, int) and not isinstance(steps, bool):
        saved.append(f"{steps:,} planned step(s) not run")
    if secs is not None:
        money = f" and ${secs / 3600 * usd_per_hour:.2f}" if usd_per_hour else ""
        saved.append(f"{secs / 60:.1f} min{money} saved against the plan")
    return parts[0] + (": " + ", ".join(saved) if saved else "")
