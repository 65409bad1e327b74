"""The run folder's names, in one place: the metrics file, the stop request, checkpoint and
sample naming, and what a checkpoint's name says (its step).

Every reader and writer of a run folder (the engine, the trainer runner, compute's shell on the
instance, export, evaluate, the dashboard, the CLI) spells these names through this module; a
test (tests/test_rundir_names.py) checks that no module outside ``rundir/`` spells them itself.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#: One JSON object per line: a step, an eval, a checkpoint (engine/metrics.py writes it).
METRICS = "metrics.jsonl"
#: Written into a run folder (``run/STOP`` on an instance): the job saves a checkpoint at its next
#: step and exits cleanly. Its text is the reason. Never pulled home (compute/remote.py).
STOP = "STOP"
#: The checkpoint folders, ``checkpoints/step-N/``, and the sample files, ``samples/``.
CHECKPOINTS = "checkpoints"
SAMPLES = "samples"

_CHECKPOINT = "step-"
#: ``checkpoints/step-N``: a glob for any of them.
CHECKPOINT_GLOB = _CHECKPOINT + "*"
_CHECKPOINT_RE = re.compile(r"step-(\d{1,12})")
#: sd-scripts' checkpoints are per epoch (trainers/base.py keys: step-500 | epoch-2 | last).
_EPOCH_RE = re.compile(r"epoch-(\d{1,12})")
#: Sample files: ``step000040-01.png`` (the samples of step 40, prompt 1), ``step000040-grid.png``
#: (image grid) and ``step000040-frames.png`` (a video run's contact sheet). An external trainer's
#: samples keep their own tag before the dash (trainers/base.py).
SAMPLE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".mp4", ".webm")
_SAMPLE_RE = re.compile(r"step(\d{1,12})-(\d{2,4})\.(png|jpg|jpeg|webp|mp4|webm|txt)")
_SAMPLE_PARTS_RE = re.compile(r"(.+?)-(\d+|grid|frames)\.(png|jpg|jpeg|webp|mp4|webm)")


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint at ``step``: ``step-N``."""
    return f"{_CHECKPOINT}{int(step)}"


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint's name says (``step-120`` -> 120); None for any other name."""
    m = _CHECKPOINT_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def sample_tag(step: int) -> str:
    """The stem prefix of the samples of ``step``: ``step000040`` (the files are ``<tag>-NN.ext``)."""
    return f"step{int(step):06d}"


def sample_file(tag: str, index: int, ext: str) -> str:
    """A sample's file name: ``<tag>-NN<ext>`` (``step000040-01.png``)."""
    return f"{tag}-{int(index):02d}{ext}"


def sample_step(name: str) -> tuple[int, int] | None:
    """(step, prompt index) of a sample file lorapod's engines named (``step000040-01.png`` ->
    (40, 1)); None for any other name, the grid and contact sheet included."""
    m = _SAMPLE_RE.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


#: an LLM run's samples: the adapter's answers to samples.prompts at one save (engine/llm.py)
ANSWERS_SUFFIX = "-answers.jsonl"


def answers_file(tag: str) -> str:
    """``step000040-answers.jsonl``: the answers an LLM run wrote at ``tag``."""
    return f"{tag}{ANSWERS_SUFFIX}"


def answers_tag(name: str) -> str | None:
    """The tag of an answers file's name, None for any other name."""
    return name[: -len(ANSWERS_SUFFIX)] or None if name.endswith(ANSWERS_SUFFIX) else None


def sample_parts(name: str) -> tuple[str, str] | None:
    """(tag, part) of a sample file of any trainer: ``step000040-01.png`` -> (step000040, 01),
    ``step000040-grid.png`` -> (step000040, grid); None for a name of another shape."""
    m = _SAMPLE_PARTS_RE.fullmatch(name)
    return (m.group(1), m.group(2)) if m else None


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def checkpoints_by_step(folder: Path) -> list[tuple[int, Path]]:
    """The ``step-N`` folders in ``folder`` (a run's ``checkpoints/``), oldest first: real folders,
    never links (a pulled run folder holds what a host sent)."""
    if not _real_dir(folder):
        return []
    try:
        with os.scandir(folder) as it:
            found = [(step, Path(e.path)) for e in it
                     if e.is_dir(follow_symlinks=False) and (step := checkpoint_step(e.name)) is not None]
    except OSError:
        return []
    return sorted(found)


def has_checkpoints(folder: Path) -> bool:
    """Whether ``folder`` (a run's ``checkpoints/``) holds any ``step-N`` folder."""
    return bool(checkpoints_by_step(folder))


def last_checkpoint(root: Path) -> str | None:
    """The newest checkpoint of a run folder by its number: ``step-N``, or ``epoch-N`` (as
    trainers/base.py names sd-scripts'; a step beats an epoch). A real folder, never a link. None
    when there is none."""
    folder = Path(root) / CHECKPOINTS
    if not _real_dir(folder):
        return None
    try:
        with os.scandir(folder) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)
                     and (_CHECKPOINT_RE.fullmatch(e.name) or _EPOCH_RE.fullmatch(e.name))]
    except OSError:
        return None
    return max(names, key=lambda n: (n.startswith(_CHECKPOINT), int(n.split("-")[1])), default=None)
