"""The base class of the trainer adapters, and the small pieces they share.

An adapter turns a :class:`~lorapod.spec.JobSpec` into a :class:`~lorapod.trainers.job.TrainerJob`
(``trainers/job.py``): the files to write (config YAML, dataset TOML, prompt files), the setup
commands (clone at the pinned commit, install into the job's Python, the torch build), the
commands that train, and the notes on spec settings that have no effect. Everything is plain data,
so ``lorapod train --print`` shows exactly what ``lorapod run`` will execute, and tests can compare
it with golden files and check every emitted option against the trainer's recorded interface
(:mod:`lorapod.trainers.contracts`).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from lorapod.spec import prompts_of  # noqa: F401  (the trainers read it from here)
from lorapod.trainers.job import Command, TrainerJob, TrainerRefused, shell_quote

if TYPE_CHECKING:
    from lorapod.trainers.import_result import ImportResult


@dataclass(frozen=True)
class Layout:
    """Where things live on the machine that runs the trainer, under the job's work folder.

    ``work`` is an absolute path on the instance, or the literal ``$WORK`` when printing.
    """

    work: str
    python: str = "python3"  # the job's Python on that machine

    src = property(lambda self: f"{self.work}/trainer/src")  # the trainer's checkout
    job = property(lambda self: f"{self.work}/trainer/job")  # files lorapod writes for it
    out = property(lambda self: f"{self.work}/trainer/out")  # its output_dir
    logs = property(lambda self: f"{self.work}/trainer/logs")  # its TensorBoard logs
    models = property(lambda self: f"{self.work}/trainer/models")  # files downloaded for it
    run = property(lambda self: f"{self.work}/run")  # lorapod's run folder


@dataclass(frozen=True)
class Artifact:
    """Something the trainer wrote that belongs in lorapod's run folder."""

    kind: Literal["checkpoint", "state", "sample", "final"]
    key: str  # step-500 | epoch-2 | last (checkpoints), the file name (samples)
    path: Path


class Trainer:
    """Base of the adapters. Subclasses set the class attributes and implement ``build``."""

    name: ClassVar[str]
    title: ClassVar[str]
    families: ClassVar[tuple[str, ...]]
    contract: ClassVar[str]  # file name under trainers/contracts/
    repo: ClassVar[str | None] = None  # git URL; None when it installs from PyPI
    commit: ClassVar[str | None] = None
    install: ClassVar[tuple[str, ...]] = ()  # pip arguments, run in the checkout
    torch: ClassVar[str] = "torch>=2.4"  # the torch build it needs (kept when already satisfied)
    torch_index: ClassVar[str] = "https://download.pytorch.org/whl/cu128"
    # what a stop waits for: the next checkpoint, or (kohya) the next state folder it resumes from
    resume_kind: ClassVar[Literal["checkpoint", "state"]] = "checkpoint"

    # the spec's trackers (``tracking``) the trainer cannot log to itself without losing what lorapod
    # reads: the trainer wrapper feeds them from the bridged metrics instead (trainers/runner.py)
    forwarded_trackers: ClassVar[tuple[str, ...]] = ()

    # ---------------------------------------------------------------- building

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        raise NotImplementedError

    def setup_commands(self, layout: Layout, python: str, src: str | None = None) -> list[Command]:
        """Clone at the pinned commit and install into the job's Python.

        ``src`` is an existing checkout on the instance, its requirements already installed (used
        as is: nothing cloned or installed, for axolotl too), or another git URL to clone at the
        pinned commit (a mirror)."""
        if src and not _is_url(src):
            return []
        cmds: list[Command] = []
        if self.repo is not None:
            url = src or self.repo
            d = shell_quote(layout.src)
            cmds.append(Command(f"clone {url} at {self.commit}", [
                f"rm -rf {d} && git clone --quiet {shlex.quote(url)} {d} && "
                f"git -C {d} checkout --quiet {self.commit}"], "setup", shell=True))
        cmds.append(Command(f"torch build ({self.torch})", [python, "-m", "pip", "install", "-q", self.torch,
                                                           "--extra-index-url", self.torch_index], "setup"))
        if self.install:
            cmds.append(Command("install requirements", [python, "-m", "pip", "install", "-q", *self.install],
                                "setup", cwd=layout.src if self.repo else None))
        return cmds

    # ---------------------------------------------------------------- checks

    def comfyui_hint(self, family: str) -> str | None:
        """How a checkpoint of ``family`` this trainer saved becomes a file ComfyUI loads whole, where
        the trainer ships a converter for it (``lorapod export --to comfyui`` says it on a refusal)."""
        return None

    def refuse(self, spec) -> list[str]:
        """Reasons this trainer cannot run the spec as written (empty: it can)."""
        fam = spec.model.family
        if fam == "auto":
            return [f"set model.family ({', '.join(self.families)}): {self.title} needs it to pick its script"]
        if fam not in self.families:
            return [f"{self.title} does not train model.family {fam!r} here (it takes: {', '.join(self.families)})"]
        return []

    def check(self, job: TrainerJob) -> None:
        """Every emitted option against the recorded interface of the pinned version."""
        from lorapod.trainers.contracts import check_job

        check_job(self, job)

    # ---------------------------------------------------------------- lorapod import

    #: how this trainer's config files look, for ``lorapod import``'s message when a file is none of
    #: them; None: ``lorapod import`` does not read its configs
    config_kind: ClassVar[str | None] = None

    @classmethod
    def reads_config(cls, path: Path, cfg: Any) -> bool:
        """Whether ``cfg`` (the file at ``path``, parsed as TOML or YAML by its suffix) is one of its configs."""
        return False

    def import_config(self, cfg: Any, flags: str = "") -> ImportResult:
        """The spec its config means, with every setting lorapod has no word for listed, not dropped."""
        raise NotImplementedError

    # ---------------------------------------------------------------- on the instance

    def metrics_parser(self, job: TrainerJob):
        """An object with ``feed(text) -> list[dict]`` and ``poll() -> list[dict]``."""
        raise NotImplementedError

    def artifacts(self, layout: Layout, name: str) -> list[Artifact]:
        raise NotImplementedError

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        """Point the job at a checkpoint pulled into the run folder (``lorapod run --resume``)."""
        raise TrainerRefused(f"{self.title} cannot resume from {checkpoint}",
                             hint="start a new run; its checkpoints are in the run folder")

    # the trainer's own refusal texts (a fragment of its exception message) -> the spec change that fixes it
    refusals: ClassVar[dict[str, str]] = {}

    def fix_for(self, reason: str | None) -> str | None:
        """The spec change for a refusal the trainer printed on the instance, when lorapod knows it."""
        return next((fix for text, fix in self.refusals.items() if reason and text in reason), None)

    def forwarded(self, spec) -> list[str]:
        """The spec's trackers the wrapper opens for this trainer's bridged metrics."""
        wanted = ["wandb"] if spec.tracking.wandb is not None else []
        return [n for n in wanted if n in self.forwarded_trackers]

    def stop_trigger(self, layout: Layout) -> Path | None:
        """A file that asks the trainer to save now (None: wait for its next save)."""
        return None


def _is_url(s: str) -> bool:
    return "://" in s or s.startswith("git@") or s.endswith(".git")


def refuse_all(trainer: Trainer, spec) -> None:
    reasons = trainer.refuse(spec)
    if reasons:
        raise TrainerRefused(f"{trainer.title} cannot run this spec:\n  - " + "\n  - ".join(reasons),
                             hint="change the spec (--set key=value), or pick another --trainer; "
                                  "without --trainer lorapod's own engine runs it")


def image_count(spec) -> int | None:
    """Images in the spec's data folders, when they are on this machine."""
    from lorapod.data.scan import IMAGE_EXTS

    n = 0
    for p in spec.data_paths():
        if not p.is_dir():
            return None
        n += sum(1 for f in p.rglob("*") if f.suffix.lower() in IMAGE_EXTS)
    return n or None


def total_steps(spec, images: int | None) -> int | None:
    """Optimizer steps of the spec: max_steps, else epochs x ceil(images x repeats / batch) / accum."""
    t = spec.train
    if t.max_steps:
        return t.max_steps
    if not images:
        return None
    per_epoch = math.ceil(images * spec.data.repeats / t.micro_batch_size)
    return max(1, math.ceil(per_epoch * t.epochs / t.grad_accum))


def safe_name(spec) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.output.name or "lora").strip("-") or "lora"


def precision(spec) -> str:
    """bf16 | fp16 | fp32 for the trainer (auto is bf16: every GPU these trainers target has it)."""
    return {"auto": "bf16"}.get(spec.train.precision, spec.train.precision)
