"""Atomic, resumable checkpoints shared by every recipe (LLM and diffusion).

A checkpoint is a folder ``checkpoints/step-N/`` holding:

- ``adapter.safetensors``   the trainable (LoRA) weights only
- ``optimizer.safetensors`` + ``optimizer.json``   optimizer and LR-scheduler state
- ``rng.safetensors`` + ``rng.json``               python / numpy / torch (CPU and this process's GPU) generator states
- ``state.json``            step, epoch, position in the epoch, and the recipe's own counters
- ``manifest.json``         size and sha256 of every file above, written last

It is written into a hidden temporary folder and renamed into place only when complete, so a
crash or a full disk never leaves a ``step-N`` that looks whole, and never touches an earlier
checkpoint. ``latest()`` verifies the manifest, so a damaged folder is skipped with a warning
rather than resumed from.

No pickle: a checkpoint may come back from a rented machine whose owner has root, and
unpickling runs code. Tensors go to safetensors, everything else (numbers, strings, tuples,
dicts with integer keys) to JSON, through :func:`encode_state` / :func:`decode_state`. Older
``.pt`` files are read only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lorapod.errors import CheckpointError
from lorapod.fsutil import atomic_dir, sha256_file
from lorapod.rundir.layout import checkpoint_name, checkpoints_by_step


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
        # this process's GPU only: torchrun shows every process all the node's GPUs, and a state
        # per visible GPU could not be restored on a machine with fewer (an 8-GPU node resumed on
        # a 1-GPU pod); the loop reseeds every step under DDP anyway
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list | tuple):  # an older checkpoint: one state per GPU that was visible
            mine = torch.cuda.current_device()
            cuda = cuda[mine] if mine < len(cuda) else (cuda[0] if cuda else None)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


@dataclass
class Checkpoint:
    path: Path
    state: TrainState

    def adapter(self) -> dict[str, torch.Tensor]:
        return load_file(str(self.path / "adapter.safetensors"))

    def optimizer(self) -> dict[str, Any]:
        return load_state(self.path, "optimizer")

    def rng(self) -> dict[str, Any]:
        return load_state(self.path, "rng")


def encode_state(obj: Any, tensors: dict[str, torch.Tensor], path: str = "t") -> Any:
    """``obj`` as JSON-able data; its tensors (and numpy arrays) go into ``tensors`` by name."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64) if obj.dtype.kind in "ui"
                                         else np.ascontiguousarray(obj)).clone()
        return {"__ndarray__": path, "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        items = [[encode_state(k, tensors, f"{path}.k{i}"), encode_state(v, tensors, f"{path}.{i}")]
                 for i, (k, v) in enumerate(obj.items())]
        return {"__dict__": items}
    raise CheckpointError(f"cannot store a {type(obj).__name__} in a checkpoint",
                          hint="checkpoint state must be tensors, numbers, strings, lists, tuples and dicts")


def decode_state(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of :func:`encode_state`."""
    if isinstance(data, list):
        return [decode_state(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if "__tensor__" in data:
        return tensors[data["__tensor__"]]
    if "__ndarray__" in data:
        return tensors[data["__ndarray__"]].numpy().astype(data["dtype"])
    if "__tuple__" in data:
        return tuple(decode_state(v, tensors) for v in data["__tuple__"])
    if "__dict__" in data:
        return {_hashable(decode_state(k, tensors)): decode_state(v, tensors) for k, v in data["__dict__"]}
    raise CheckpointError(f"unrecognised checkpoint entry {sorted(data)[:3]}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def save_state(folder: Path, name: str, obj: Any) -> None:
    """``name.safetensors`` (tensors) + ``name.json`` (the rest): nothing that runs code on load."""
    tensors: dict[str, torch.Tensor] = {}
    data = encode_state(obj, tensors)
    save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


def load_state(folder: Path, name: str) -> Any:
    if (folder / f"{name}.json").is_file():
        tensors = load_file(str(folder / f"{name}.safetensors"))
        return decode_state(json.loads((folder / f"{name}.json").read_text(encoding="utf-8")), tensors)
    legacy = folder / f"{name}.pt"
    try:  # a checkpoint from an older lorapod: tensors and plain containers only, never code
        return torch.load(legacy, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{legacy} cannot be read safely ({type(exc).__name__})",
                              hint="resume from a checkpoint written by this lorapod version") from exc


class CheckpointManager:
    """Writes ``step-N`` folders atomically, keeps the last K (and the quality autopilot's pick:
    ``protect`` names the folders kept beyond them), finds the newest valid one."""

    def __init__(self, root: Path, keep_last: int = 3, protect=None) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.protect = protect  # () -> set of folder names never pruned, or None

    def save(
        self,
        state: TrainState,
        adapter: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any],
        extra_files: dict[str, bytes] | None = None,
        rng: dict[str, Any] | None = None,
    ) -> Path:
        """``rng``: the generators' states to store, when not the current ones (a step left half
        done is saved with the states it began with: engine/loop.py)."""
        final = self.root / checkpoint_name(state.step)
        try:
            with atomic_dir(final) as tmp:
                save_file({k: v.detach().contiguous().cpu() for k, v in adapter.items()}, str(tmp / "adapter.safetensors"))
                save_state(tmp, "optimizer", optimizer_state)
                save_state(tmp, "rng", rng if rng is not None else capture_rng())
                (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
                for name, data in (extra_files or {}).items():
                    (tmp / name).write_bytes(data)
                files = sorted(p for p in tmp.iterdir() if p.is_file())
                manifest = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise CheckpointError(
                    f"the disk filled up while writing checkpoint {checkpoint_name(state.step)}; it was discarded, "
                    "earlier checkpoints are intact",
                    hint=f"free space on {self.root} (or lower save.keep_last), then resume with --resume",
                ) from exc
            raise CheckpointError(f"could not write checkpoint {checkpoint_name(state.step)}: {exc}") from exc
        self._prune()
        return final

    def list(self) -> list[Path]:
        return [p for _, p in checkpoints_by_step(self.root)]

    def verify(self, path: Path) -> bool:
        manifest_file = path / "manifest.json"
        if not manifest_file.is_file():
            return False
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
            return all(
                (path / name).is_file()
                and not (path / name).is_symlink()
                and (path / name).stat().st_size == meta["bytes"]
                and sha256_file(path / name) == meta["sha256"]
                for name, meta in manifest.items()
            )
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def latest(self, skipped: list[Path] | None = None) -> Checkpoint | None:
        """The newest checkpoint whose files match its manifest; damaged ones are skipped (and
        appended to ``skipped``, so the caller can say so)."""
        for path in reversed(self.list()):
            if self.verify(path):
                return self.load(path)
            if skipped is not None:
                skipped.append(path)
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
        keep = set(self.protect()) if self.protect is not None else set()
        kept = [p for p in self.list() if p.name not in keep]
        for old in kept[: max(0, len(kept) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)


def resume_point(checkpoints: Path, event, log) -> Checkpoint | None:
    """The newest valid checkpoint of a run folder to resume from, or None (said aloud)."""
    skipped: list[Path] = []
    checkpoint = CheckpointManager(checkpoints).latest(skipped)
    for path in skipped:  # on the terminal too: a skipped checkpoint costs the steps since the one before
        msg = f"skipped checkpoint {path.name}: its files do not match its manifest.json (cut off or damaged)"
        event(msg)
        log(msg)
    if checkpoint is None:
        event("no valid checkpoint to resume from: starting from scratch")
        log("no valid checkpoint found: starting from step 0")
    else:
        st = checkpoint.state
        log(f"resuming from {checkpoint.path.name} (step {st.step}, epoch {st.epoch})")
    return checkpoint
