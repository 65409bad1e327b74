"""One error family for everything lorapod reports to a person.

Every message says what went wrong *and what to do next*; the CLI prints ``LorapodError``
without a traceback (``--debug`` shows it). Anything else reaching the CLI is a bug.
"""

from __future__ import annotations

#: The exit status of a job that SIGTERM stopped after it saved its checkpoint (EX_TEMPFAIL in
#: sysexits.h, "try again later"): a spot preemption, ``timeout``, SLURM, Kubernetes. Distinct from
#: 130 (Ctrl-C) and from a failure, so whoever starts the job again (the controller's recovery)
#: knows nothing was lost. engine/loop.py exits with it; job.sh records it in job.exit.
PREEMPTED_EXIT = 75


class LorapodError(Exception):
    """Base of every error lorapod raises on purpose.

    ``hint`` is the next step for the user; it is printed on its own line.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  -> {self.hint}"


class SpecError(LorapodError):
    """The job spec is malformed: unknown key, bad value, impossible combination."""

    exit_code = 2


class DataError(LorapodError):
    """The dataset cannot be used: missing, empty, malformed."""


class ModelLoadError(LorapodError):
    """A base model or tokenizer could not be loaded (offline, wrong id, wrong family)."""


class CheckpointError(LorapodError):
    """A checkpoint could not be written or read (disk full, corrupt, missing)."""


class DependencyError(LorapodError):
    """An optional dependency is missing; the hint names the extra to install."""


class HardwareError(LorapodError):
    """The requested setting needs hardware this machine lacks (e.g. QLoRA without CUDA)."""


class OutOfMemory(HardwareError):
    """Training ran out of GPU memory. The loop saved a checkpoint first (when a step was done);
    the message has the measured peak and the plan's estimate, the hint the cheapest change that fits."""

    def __init__(self, message: str, hint: str | None = None, *, step: int = 0, checkpoint=None,
                 peak_gb: float | None = None, planned_gb: float | None = None) -> None:
        super().__init__(message, hint)
        self.step, self.checkpoint, self.peak_gb, self.planned_gb = step, checkpoint, peak_gb, planned_gb


class PlanError(LorapodError):
    """The planner cannot answer: unknown GPU/model, nothing fits, budget too small."""


class ProviderError(LorapodError):
    """A cloud provider refused or failed a request."""


class BudgetError(LorapodError):
    """A job would cross, or crossed, its dollar or hour cap."""


class RemoteError(LorapodError):
    """Something failed on a remote instance (SSH, sync, the job itself)."""


class ExportError(LorapodError):
    """A LoRA file cannot be written or read in the requested format."""


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise a DependencyError with the install hint.

    Used instead of ``try: import x except ImportError: pass`` so a missing backend is
    always reported, never silently skipped.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyError(
            f"{purpose} needs the Python package '{module.split('.')[0]}', which is not installed ({exc}).",
            hint=f"pip install 'lorapod[{extra}]'",
        ) from exc
