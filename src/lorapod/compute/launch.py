"""How the job starts on an instance with several GPUs: ``lorapod train`` under torchrun.

Plugged into :class:`lorapod.compute.session.RunOptions` as its ``job_command``: with
``compute.gpus: N`` the usual ``python -m lorapod train spec.yaml --run-dir run`` becomes
``python -m torch.distributed.run --nproc-per-node N --standalone -m lorapod train ...``, one
process per GPU. The process group is still the job's (``setsid`` in job.sh), so STOP, the
watchdog and teardown treat the N processes as one job.
"""

from __future__ import annotations

from collections.abc import Callable

from lorapod.compute.remote import job_command_from_env

JobCommand = Callable[[str, str, str, bool], list[str]]


def job_command_for(gpus: int, base: JobCommand = job_command_from_env) -> JobCommand:
    """``base`` for one GPU; for N, the same ``lorapod`` command under torchrun. A custom
    ``LORAPOD_JOB_COMMAND`` that is not ``python -m lorapod`` is left as the user wrote it."""
    if gpus <= 1:
        return base

    def command(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
        from lorapod.engine.distributed import torchrun_argv  # imports torch: only for a multi-GPU job

        argv = base(python, spec, run_dir, resume)
        if argv[:3] != [python, "-m", "lorapod"]:
            return argv
        return torchrun_argv(gpus, argv[3:], python=python)

    return command
