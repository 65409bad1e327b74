"""Atomic, resumable checkpoints shared by every recipe (LLM and diffusion).

A checkpoint is a folder ``checkpoints/step-N/`` holding:

- ``adapter.safetensors``   the trainable (LoRA) weights only
- ``optimizer.pt``          optimizer and LR-scheduler state
- ``rng.pt``                python / numpy / torch (CPU and CUDA) generator states
- ``state.json``            step, epoch, position in the epoch, and the recipe's own counters
- ``manifest.json``         size and sha256 of every file above, written last

It is written into a hidden temporary folder and renamed into place only when complete, so a
crash or a full disk never leaves a ``step-N`` that looks whole, and never touches an earlier
checkpoint. ``latest()`` verifies the manifest, so a damaged folder is skipped with a warning
rather than resumed from.
"""

from __future__ import annotations

import errno
import hashlib
import json
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lorapod.errors import CheckpointError
from lorapod.fsutil import atomic_dir

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TrainState:
    """Where training is: enough to continue exactly where it stopped."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed
    tokens_seen: int = 0
    best_val_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Checkpoint:
    path: Path
    state: TrainState

    def adapter(self) -> dict[str, torch.Tensor]:
        return load_file(str(self.path / "adapter.safetensors"))

    def optimizer(self) -> dict[str, Any]:
        return torch.load(self.path / "optimizer.pt", map_location="cpu", weights_only=False)

    def rng(self) -> dict[str, Any]:
        return torch.load(self.path / "rng.pt", map_location="cpu", weights_only=False)


class CheckpointManager:
    """Writes ``step-N`` folders atomically, keeps the last K, finds the newest valid one."""

    def __init__(self, root: Path, keep_last: int = 3) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    def save(
        self,
        state: TrainState,
        adapter: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any],
        extra_files: dict[str, bytes] | None = None,
    ) -> Path:
        final = self.root / f"step-{state.step}"
        try:
            with atomic_dir(final) as tmp:
                save_file({k: v.detach().contiguous().cpu() for k, v in adapter.items()}, str(tmp / "adapter.safetensors"))
                torch.save(optimizer_state, tmp / "optimizer.pt")
                torch.save(capture_rng(), tmp / "rng.pt")
                (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
                for name, data in (extra_files or {}).items():
                    (tmp / name).write_bytes(data)
                files = sorted(p for p in tmp.iterdir() if p.is_file())
                manifest = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise CheckpointError(
                    f"the disk filled up while writing checkpoint step-{state.step}; it was discarded, "
                    "earlier checkpoints are intact",
                    hint=f"free space on {self.root} (or lower save.keep_last), then resume with --resume",
                ) from exc
            raise CheckpointError(f"could not write checkpoint step-{state.step}: {exc}") from exc
        self._prune()
        return final

    def list(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
        return [p for _, p in sorted(found)]

    def verify(self, path: Path) -> bool:
        manifest_file = path / "manifest.json"
        if not manifest_file.is_file():
            return False
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
            return all(
                (path / name).is_file()
                and (path / name).stat().st_size == meta["bytes"]
                and _sha256(path / name) == meta["sha256"]
                for name, meta in manifest.items()
            )
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose files match its manifest (damaged ones are skipped)."""
        for path in reversed(self.list()):
            if self.verify(path):
                return self.load(path)
        return None

    def load(self, path: Path) -> Checkpoint:
        if not self.verify(path):
            raise CheckpointError(
                f"checkpoint {path} is incomplete or damaged (its files do not match manifest.json)",
                hint="resume from an earlier checkpoint, or delete this folder",
            )
        raw = json.loads((path / "state.json").read_text(encoding="utf-8"))
        return Checkpoint(path=path, state=TrainState(**raw))

    def _prune(self) -> None:
        kept = self.list()
        for old in kept[: max(0, len(kept) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)


def resume_point(checkpoints: Path, event, log) -> Checkpoint | None:
    """The newest valid checkpoint of a run folder to resume from, or None (said aloud)."""
    checkpoint = CheckpointManager(checkpoints).latest()
    if checkpoint is None:
        event("no valid checkpoint to resume from: starting from scratch")
        log("no valid checkpoint found: starting from step 0")
    return checkpoint
