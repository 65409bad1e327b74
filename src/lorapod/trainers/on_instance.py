"""An external trainer's job as it runs on an instance: the command line the session starts
(``lorapod trainer-run``) and the job rendered with the instance's paths (``$WORK/data/...``).

Both sit below compute, so ``lorapod run`` (:mod:`lorapod.compute.prepare`) and ``lorapod train
--print`` build the same job the same way.
"""

from __future__ import annotations

from pathlib import Path


def trainer_job_command(trainer: str, src: str | None = None):
    """The job command ``lorapod run --trainer`` hands to the session (``RunOptions.job_command``)."""

    def cmd(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
        return [python, "-m", "lorapod", "trainer-run", trainer, spec, "--run-dir", run_dir,
                *(["--src", src] if src else [])]

    return cmd


def print_trainer_job(spec, trainer: str) -> str:
    """What ``lorapod train --trainer X --print`` shows: the job as it will run on an instance,
    with the dataset where ``lorapod run`` puts it (``$WORK/data/...``).

    The job is built from the data where it is now (so clips, stills and the image count shape
    it, and the same refusals apply, as on the instance), then its data paths are rewritten."""
    from lorapod.trainers import prepare
    from lorapod.trainers.base import Layout

    paths = spec.data_paths()
    moved = {str(p): f"$WORK/data/{i}-{p.name}" for i, p in enumerate(paths)}
    if spec.data.val_path:
        remote = f"$WORK/data/{len(paths)}-{Path(spec.data.val_path).name}"
        moved[str(spec.data.val_path)] = remote
        moved[str(Path(spec.data.val_path).resolve())] = remote
    _, job = prepare(spec, trainer, Layout("$WORK"))
    job.relocate(moved)
    return job.render()
