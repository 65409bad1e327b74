"""Live trackers (TensorBoard, Weights & Biases): the engine's metrics and samples as people watch them.

``metrics.jsonl`` stays the source of truth; a tracker is a view of it, so a tracker that fails
(no network, no key, a full disk) is switched off with one warning in events.log and never ends
a healthy run. Every tracker gets the same names (:func:`scalars`): ``train/loss``, ``val/loss``,
``train/lr``, ``train/tokens_per_s`` or ``train/it_per_s``, ``system/vram_gb``, ``cost/usd``.

W&B is driven through its own client (``wandb.init``/``log``/``finish``), its files in the run
folder's ``wandb/`` so that a remote run's files are pulled with the rest and an offline run can be
uploaded later with ``wandb sync``. The run id is kept in ``tracking.json``: a resumed run
continues the same W&B run (``resume="allow"``, W&B's documented way to continue a run by id).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Protocol

from lorapod.fsutil import atomic_write_text

# lorapod's metrics.jsonl keys -> the names every tracker shows
NAMES = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "step_time_s": "train/step_time_s",
    "tokens_per_s": "train/tokens_per_s", "real_tokens_per_s": "train/real_tokens_per_s",
    "mem_gb": "system/vram_gb", "rss_gb": "system/ram_gb", "usd": "cost/usd",
    "val_loss": "val/loss", "val_ppl": "val/ppl", "fixed_noise_loss": "val/fixed_noise_loss",
}
_NOT_SCALARS = ("step", "time", "epoch", "event", "path", "total_steps")  # total_steps: the plan, not a metric
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_EXTS = (".mp4", ".webm", ".gif")
ANSWER_EXT = ".jsonl"  # LLM samples: one {"prompt", "answer"} per line (engine/llm.py)
TRACKING_FILE = "tracking.json"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A metrics record's numbers under the trackers' names (train/, val/, system/, cost/)."""
    is_eval = record.get("event") == "eval"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = NAMES.get(key) or (f"val/{key.removeprefix('val_')}" if is_eval else f"train/{key}")
        out[name] = float(value)
    if not is_eval and record.get("step_time_s") and "tokens_per_s" not in record:
        out["train/it_per_s"] = 1.0 / float(record["step_time_s"])  # image recipes: one step per iteration
    if not is_eval and isinstance(record.get("epoch"), int | float):
        out["train/epoch"] = float(record["epoch"])
    return out


class Tracker(Protocol):
    name: str

    def log(self, values: dict[str, float], step: int) -> None: ...
    def sample(self, path: Path, step: int) -> None: ...
    def close(self) -> None: ...


class TensorBoardTracker:
    """torch's SummaryWriter into the run folder's tensorboard/ (images with PIL, answers as text)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # ImportError: the caller says tensorboard is missing
        )

        self._tb = SummaryWriter(log_dir=str(log_dir))

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self._tb.add_scalar(key, value, step)

    def sample(self, path: Path, step: int) -> None:
        suffix = path.suffix.lower()
        if suffix in IMAGE_EXTS:
            import numpy as np
            from PIL import Image

            with Image.open(path) as img:
                self._tb.add_image(f"samples/{path.stem}", np.asarray(img.convert("RGB")), step, dataformats="HWC")
        elif suffix == ANSWER_EXT:
            rows = read_answers(path)
            text = "\n\n".join(f"**{r['prompt']}**\n\n{r['answer']}" for r in rows)
            self._tb.add_text(f"samples/{path.stem}", text, step)
        # clips: TensorBoard's add_video needs moviepy; each clip's contact sheet (a PNG) is logged instead

    def close(self) -> None:
        self._tb.flush()
        self._tb.close()


class WandbTracker:
    """One W&B run per lorapod run (the same one again on resume)."""

    name = "wandb"

    def __init__(self, settings, run_root: Path, config: dict[str, Any], default_name: str,
                 event=lambda message: None) -> None:
        try:
            import wandb
        except ImportError as exc:
            from lorapod.errors import DependencyError

            raise DependencyError("tracking.wandb is set but the wandb client is not installed",
                                  hint="pip install 'lorapod[track]' (or wandb), or drop tracking.wandb") from exc
        self._wandb = wandb
        self.root = Path(run_root)
        previous = read_tracking(self.root).get("wandb", {})
        kwargs: dict[str, Any] = {
            "project": settings.project, "entity": settings.entity, "name": settings.name or default_name,
            "dir": str(self.root), "config": config, "resume": "allow",
            "id": previous.get("id") or None,
            # every remote step has a deadline: W&B's own init timeout (seconds), not its default 90
            "settings": wandb.Settings(init_timeout=60, console="off", x_disable_stats=True),
        }
        if settings.mode:
            kwargs["mode"] = settings.mode
        try:
            self.run = wandb.init(**kwargs)
        except Exception as exc:  # wandb raises UsageError (no key), CommError (no network), and others
            if kwargs.get("mode") == "offline" or os.environ.get("WANDB_MODE") == "offline":
                raise
            event(f"W&B: online start failed ({type(exc).__name__}: {str(exc)[:200]}); logging offline into "
                  f"{self.root / 'wandb'}: `wandb sync` uploads it later")
            kwargs["mode"] = "offline"
            self.run = wandb.init(**kwargs)
        self.mode = "offline" if self.run.settings._offline else "online"
        info = {"project": settings.project, "entity": self.run.entity or settings.entity, "name": self.run.name,
                "id": self.run.id, "mode": self.mode, "url": self.run.url, "dir": _rel(Path(self.run.dir).parent, self.root)}
        write_tracking(self.root, {"wandb": info})
        self.info = info
        event(f"W&B: run {self.run.id} ({self.mode})" + (f" at {self.run.url}" if self.run.url else
                                                            f"; upload with `wandb sync {info['dir']}`"))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def sample(self, path: Path, step: int) -> None:
        wandb = self._wandb
        suffix = path.suffix.lower()
        if suffix in IMAGE_EXTS:
            media: Any = wandb.Image(str(path), caption=path.stem)
        elif suffix in VIDEO_EXTS:
            media = wandb.Video(str(path), caption=path.stem, format=suffix.lstrip("."))
        elif suffix == ANSWER_EXT:
            media = wandb.Table(columns=["prompt", "answer"], data=[[r["prompt"], r["answer"]] for r in read_answers(path)])
        else:
            return
        self.run.log({f"samples/{_sample_key(path)}": media}, step=step)

    def close(self) -> None:
        self.run.finish()


def _sample_key(path: Path) -> str:
    """``step000040-01.png`` -> ``01``: one panel per prompt, its history over the steps."""
    stem = path.stem
    head, _, tail = stem.partition("-")
    return tail or head


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def read_answers(path: Path) -> list[dict[str, str]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            rows.append({"prompt": str(rec.get("prompt", "")), "answer": str(rec.get("answer", ""))})
    return rows


def read_tracking(run_root: Path) -> dict[str, Any]:
    """What ``tracking.json`` says about the run's trackers (W&B id, URL, mode); {} when nothing.

    The file may come from an instance: only a mapping of mappings of short strings is kept."""
    p = Path(run_root) / TRACKING_FILE
    try:
        raw = json.loads(p.read_text(encoding="utf-8")) if p.is_file() and p.stat().st_size < 64_000 else {}
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(k, str) and isinstance(v, dict):
                out[k] = {kk: vv for kk, vv in v.items() if isinstance(kk, str) and
                          (vv is None or (isinstance(vv, str) and len(vv) < 1024))}
    return out


def write_tracking(run_root: Path, update: dict[str, Any]) -> None:
    atomic_write_text(Path(run_root) / TRACKING_FILE, json.dumps({**read_tracking(run_root), **update}, indent=2) + "\n")


def wandb_url(run_root: Path) -> str | None:
    """The run's W&B URL (None when W&B is off or the run is offline and not synced)."""
    url = read_tracking(run_root).get("wandb", {}).get("url")
    return url if isinstance(url, str) and url.startswith("https://") else None


def open_trackers(spec, run, event=lambda message: None) -> list[Tracker]:
    """The spec's trackers for this run; one that cannot start is reported and left out."""
    out: list[Tracker] = []
    tracking = spec.tracking
    if tracking.tensorboard:
        try:
            out.append(TensorBoardTracker(run.tensorboard))
        except ImportError:
            warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)
    if tracking.wandb is not None:
        from lorapod.spec import redact

        config = redact(spec.model_dump(mode="json"))
        out.append(WandbTracker(tracking.wandb, run.root, config, spec.output.name or run.job_id, event))
    return out
