"""Where an export starts: a run folder, one of its checkpoints, and the adapter weights in it.

Every way a run folder can be unusable (no spec, no checkpoint, a damaged or truncated file) is
one ``ExportError`` naming the file and what was expected, before anything is written.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from lorapod.engine.checkpoint import CheckpointManager
from lorapod.errors import ExportError
from lorapod.fsutil import atomic_dir
from lorapod.rundir import RunDir
from lorapod.rundir.layout import checkpoint_name, checkpoint_step


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a truncated or foreign file is one clear error."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise ExportError(f"{path} does not exist", hint="check the path")
    try:
        with safe_open(str(path), "pt") as fh:
            meta = dict(fh.metadata() or {})
            return {k: fh.get_tensor(k) for k in fh.keys()}, meta  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise ExportError(f"{path} is not a readable safetensors file ({exc})",
                          hint="it may be truncated or not a safetensors file: copy it again, or use another "
                               "checkpoint (--checkpoint N)") from exc


@dataclass
class Source:
    run: RunDir
    spec: object  # JobSpec
    label: str  # 'step-120' or 'final'
    weights: Path  # the safetensors file with the PEFT-keyed adapter
    step: int | None

    @property
    def is_image(self) -> bool:
        return bool(self.spec.is_image)

    def state(self) -> dict[str, torch.Tensor]:
        tensors, _ = read_safetensors(self.weights)
        bad = [k for k in tensors if ".lora_A." not in k and ".lora_B." not in k]
        if not tensors or bad:
            raise ExportError(f"{self.weights} is not a LoRA adapter (e.g. key {bad[0] if bad else 'none'})",
                              hint="expected PEFT keys ending in .lora_A.weight / .lora_B.weight")
        return tensors


@dataclass(frozen=True)
class Pick:
    """The quality autopilot's decision, where its checkpoint is here and whole (quality/pick.json)."""

    step: int
    label: str
    strength: float | None
    score: float | None
    reason: str

    def note(self, is_image: bool) -> str:
        at = f" at strength {self.strength:g}" if is_image and self.strength is not None else ""
        load = (f"; load it{at} (ComfyUI's LoraLoader strength, diffusers' adapter weight)" if at else "")
        return (f"{self.label}: the quality autopilot's pick{at} ({self.reason[:300]}){load}; --checkpoint N "
                f"exports another, --final the final adapter")


def quality_pick(run: RunDir) -> Pick | None:
    """The autopilot's pick of ``run``, or None (no decision, or its checkpoint is not on this disk)."""
    from lorapod.rundir import quality as files
    from lorapod.rundir.metrics import number

    decision = files.read_json(run.root, files.PICK) or {}
    label = decision.get("checkpoint")
    step = checkpoint_step(label) if isinstance(label, str) else None
    if step is None:
        return None
    path = run.checkpoints / checkpoint_name(step)
    if not CheckpointManager(run.checkpoints).verify(path):
        return None
    return Pick(step, path.name, number(decision.get("strength")), number(decision.get("score")),
                str(decision.get("reason") or "")[:2000])


def checkpoints(run: RunDir) -> list[Path]:
    return CheckpointManager(run.checkpoints).list()


def open_source(run_path: str | Path, checkpoint: int | None = None) -> Source:
    """The run's final adapter by default, or ``checkpoints/step-N`` with ``checkpoint=N``."""
    from lorapod.spec import load_spec

    run = RunDir.open(run_path)
    spec = load_spec(run.spec_file)
    final = run.adapter / ("pytorch_lora_weights.safetensors" if spec.is_image else "adapter_model.safetensors")
    if checkpoint is None and final.is_file():
        return Source(run, spec, "final", final, None)
    steps = checkpoints(run)
    if not steps:
        raise ExportError(f"{run.root} has no checkpoint to export (checkpoints/ is empty and adapter/ has no {final.name})",
                          hint="train first (`lorapod train`), or pull a remote run's checkpoints (`lorapod pull JOB`)")
    if checkpoint is None:
        path = steps[-1]
    else:
        path = run.checkpoints / checkpoint_name(checkpoint)
        if path not in steps:
            have = ", ".join(str(checkpoint_step(p.name)) for p in steps)
            raise ExportError(f"{run.root} has no checkpoint {path.name}", hint=f"checkpoints there: {have}")
    if not CheckpointManager(run.checkpoints).verify(path):
        raise ExportError(f"checkpoint {path} is incomplete or damaged (its files do not match manifest.json)",
                          hint="pick another checkpoint with --checkpoint N")
    return Source(run, spec, path.name, path / "adapter.safetensors", checkpoint_step(path.name))


@contextmanager
def output_dir(out: Path) -> Iterator[Path]:
    """A fresh output folder written whole or not at all; an existing non-empty one is never touched."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists; lorapod export never overwrites",
                          hint="pass another --out, or delete that folder first")
    if out.is_dir():
        shutil.rmtree(out)
    with atomic_dir(out) as tmp:
        yield tmp
