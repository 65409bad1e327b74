"""Everything ``lorapod run`` does before it rents: arguments in, a checked job ready to start out.

:func:`prepare_run` is ``lorapod run`` as a library call (litgpt's CLI is the same
thin layer over ``setup()`` with the same parameter names). In order: the resume lookup (the
job's own spec, target and trainer), the spec and its overrides, the video pre-flight (its clips
give windows, the job fits the GPU: :mod:`lorapod.engine.diffusion.video_preflight`), the
SkyPilot branch (SkyPilot runs the lifecycle itself), the provider for ``--on`` with the options
that kind of target takes, the external trainer's refusals, the pre-flight (data, model, token,
disk: :mod:`lorapod.compute.preflight`), a network volume where the provider mounts one
(:class:`~lorapod.compute.provider.SupportsVolumes`), and the run's :class:`RunOptions` with
the trainer's job command swapped in. Every refusal comes before anything is created.

:func:`prepare_sweep` prepares every job of a sweep on every target with :func:`prepare_run`
before the first starts, so a bad job fails the sweep, named, before any instance exists.

Kept apart from :mod:`lorapod.compute.launch`, which holds one thing the options carry (how the
job command runs under torchrun); this module holds the sequence of checks, which is larger and
has callers of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lorapod.compute.launch import job_command_for
from lorapod.compute.offers import planned_job
from lorapod.compute.provider import Provider, SupportsVolumes, capability, from_target, on_hint
from lorapod.compute.remote import Bootstrap
from lorapod.compute.session import RunOptions
from lorapod.errors import LorapodError, SpecError
from lorapod.spec import JobSpec, apply_report_to, load_spec
from lorapod.store.ledger import Ledger

if TYPE_CHECKING:
    from lorapod.plan.job import Job

Say = Callable[[str], None]
SKY = "sky"  # the --on value SkyPilot takes: compute/skypilot.py runs the whole lifecycle


@dataclass
class RunFlags:
    """``lorapod run``'s options by the CLI's names (``set_`` is ``--set``). A None keeps the
    spec's value, or the :class:`RunOptions` default for the ``knobs``."""

    set_: Sequence[str] = ()
    report_to: str | None = None
    identity: Path | None = None
    gpu: str | None = None
    gpus: int | None = None
    max_usd: float | None = None
    max_hours: float | None = None
    bootstrap: Literal["source", "wheel"] = "source"
    python: str = "auto"
    deps: Literal["auto", "none"] = "auto"
    image: str | None = None
    volume: str | None = None
    force: bool = False
    usd_per_hour: float | None = None
    forward_env: Sequence[str] = ()
    trainer: str | None = None
    trainer_src: str | None = None
    spot: str | None = None  # --spot never|auto|always: overrides compute.spot
    #: :class:`RunOptions` fields set by the hidden test flags (``poll_s`` ...); absent ones keep their default
    knobs: Mapping[str, Any] = field(default_factory=dict)
    #: overrides of ``watchdog.DEFAULTS`` (``heartbeat_timeout_s``, ``poll_s``, ``stall_s``)
    watchdog: Mapping[str, float] = field(default_factory=dict)


@dataclass
class PreparedRun:
    """A checked job, ready for :func:`lorapod.compute.session.run_remote` (or, on ``sky``,
    :func:`lorapod.compute.skypilot.run_on_sky`)."""

    spec: JobSpec
    provider: Provider | None  # None on sky: SkyPilot creates and destroys the machine itself
    target: str
    options: RunOptions
    trainer: str | None  # the external trainer on the instance (canonical name), or None: lorapod's engine
    spec_path: str | None
    resume_job: str | None
    ledger: Ledger
    #: the planner's job, planned once here (the data counted once) and carried to the session's
    #: offer ranking; None on sky, or where the planner cannot estimate the job
    job: Job | None = None

    @property
    def on_sky(self) -> bool:
        return self.target == SKY


def provider_for(target: str, identity: Path | None = None, usd_per_hour: float = 0.0) -> Provider:
    """The provider for one ``--on`` value, with the options that kind of target takes: an SSH
    host its key and price, this machine its price, a cloud nothing (it prices its own offers)."""
    if target.startswith("ssh://"):
        return from_target(target, identity=identity, usd_per_hour=usd_per_hour)
    if target == "local":
        return from_target(target, usd_per_hour=usd_per_hour)
    return from_target(target)


def run_options(spec: JobSpec, flags: RunFlags, trainer: str | None = None) -> RunOptions:
    """The session's knobs from the flags; with an external trainer its wrapper replaces
    lorapod's engine as the job command on the instance."""
    from lorapod.trainers import canonical
    from lorapod.trainers.on_instance import trainer_job_command

    opts = RunOptions(identity=flags.identity, gpu=flags.gpu, max_usd=flags.max_usd, max_hours=flags.max_hours,
                      bootstrap=Bootstrap(flags.bootstrap, flags.python, flags.deps),
                      job_command=job_command_for(spec.compute.gpus), watchdog=dict(flags.watchdog),
                      forward_env=tuple(flags.forward_env) if flags.forward_env else None, **flags.knobs)
    if trainer:
        opts.job_command = trainer_job_command(trainer, flags.trainer_src)
        opts.trainer = canonical(trainer)
    return opts


def prepare_run(spec: Path | JobSpec | None = None, on: str | None = None, flags: RunFlags | None = None, *,
                resume_job: str | None = None, spec_path: str | None = None, ledger: Ledger | None = None,
                say: Say = print, note: Say = print) -> PreparedRun:
    """Resolve and check one job (``spec`` a file or a loaded spec; or ``resume_job``, a job id
    from the ledger) for ``on`` (default: the spec's ``compute.provider``). ``say`` gets what is
    being done, ``note`` what is worth knowing but does not stop the run; anything that must stop
    it raises a :class:`LorapodError` before anything is created."""
    flags = flags or RunFlags()
    ledger = ledger or Ledger()
    overrides = [*flags.set_, f"compute.gpus={flags.gpus}"] if flags.gpus else list(flags.set_)
    if flags.spot is not None:  # --spot overrides the spec's compute.spot
        overrides.append(f"compute.spot={flags.spot}")
    trainer = flags.trainer
    if resume_job:
        spec_obj, target, spec_path, trainer, resume_job = _resumed(ledger, resume_job, on, overrides, trainer, say)
    else:
        if spec is None:
            raise SpecError("no spec given", hint="lorapod run SPEC --on ..., or lorapod run --resume JOB")
        if isinstance(spec, JobSpec):
            spec_obj = load_spec(raw=spec.model_dump(mode="json"), overrides=overrides) if overrides else spec
        else:
            spec_obj, spec_path = load_spec(spec, overrides), spec_path or str(spec)
        target = on or spec_obj.compute.provider
    spec_obj = apply_report_to(spec_obj, flags.report_to)
    if target in (None, ""):
        raise SpecError("where should it run?", hint=f"--on {on_hint()}")
    if spec_obj.is_video and not resume_job:  # before renting: the clips give windows, the job fits the GPU
        from lorapod.engine.diffusion.video_preflight import preflight as video_preflight

        video_preflight(spec_obj, flags.gpu or spec_obj.compute.gpu, say=say)
    if target == SKY:  # SkyPilot runs the lifecycle itself (compute/skypilot.py)
        return PreparedRun(spec_obj, None, target, run_options(spec_obj, flags), None, spec_path, resume_job, ledger)
    if flags.bootstrap not in ("source", "wheel"):
        raise SpecError(f"--bootstrap {flags.bootstrap!r}", hint="source | wheel")
    if flags.deps not in ("auto", "none"):
        raise SpecError(f"--deps {flags.deps!r}", hint="auto | none")
    if flags.image:
        spec_obj.compute.image = flags.image
    if flags.volume:
        spec_obj.compute.volume = flags.volume
    rate = flags.usd_per_hour if flags.usd_per_hour is not None else (spec_obj.compute.usd_per_hour or 0.0)
    provider = provider_for(target, flags.identity, rate)
    if trainer:  # what the trainer cannot do is refused first, before the data check and renting
        from lorapod.trainers.on_instance import print_trainer_job

        print_trainer_job(spec_obj, trainer)
    from lorapod.compute.doctor import doctor_note
    from lorapod.compute.preflight import preflight

    job = planned_job(spec_obj)  # once per run: every room below reads this one
    from lorapod.compute.recovery import run_tier

    on_spot, tier_note = run_tier(spec_obj, provider, job)  # compute.spot (after --spot): the plan's tier choice
    if tier_note:
        note(tier_note)
    for text in preflight(spec_obj, provider, job, force=flags.force, deps=flags.deps,
                          trainer=trainer).notes:
        note(text)
    if doc := doctor_note(ledger, provider.name):
        note(doc)
    if spec_obj.compute.volume:  # after the checks above: a new volume bills from its creation
        if not isinstance(provider, SupportsVolumes):
            why = capability(provider, "network_volume").reason
            raise SpecError(f"compute.volume is not supported on {provider.name} ({why})",
                            hint="drop compute.volume / --volume for this provider (docs/remote.md, Volumes)")
        provider.attach_volume(spec_obj, spec_obj.compute.volume, job, flags.gpu, flags.max_usd, flags.max_hours,
                               say)
    options = run_options(spec_obj, flags, trainer)
    options.spot_policy, options.spot = spec_obj.compute.spot, on_spot
    return PreparedRun(spec_obj, provider, target, options, trainer, spec_path, resume_job, ledger, job)


def _resumed(ledger: Ledger, job_id: str, on: str | None, overrides: list[str], trainer: str | None,
             say: Say) -> tuple[JobSpec, str | None, str | None, str | None, str]:
    """A job from the ledger, to continue from its last pulled checkpoint: its resolved spec, its
    target unless ``on`` names another, and the trainer it was started with."""
    from lorapod.compute.jobs import find_job
    from lorapod.rundir import RunDir
    from lorapod.store.ledger import controller_alive
    from lorapod.trainers import for_resume

    job = find_job(ledger, job_id)
    if job.state in ("starting", "running", "stopping") and controller_alive(job.controller):
        raise SpecError(f"job {job.id} is still running (controller {job.controller})",
                        hint=f"follow it with `lorapod logs -f {job.id}`, or stop it with `lorapod down {job.id}`")
    spec = load_spec(Path(job.run_dir) / "spec.yaml", overrides)
    trainer = for_resume(RunDir(Path(job.run_dir)), trainer, f"job {job.id}", say)
    return spec, on or job.target or job.provider, job.spec_path, trainer, job.id


@dataclass
class PreparedSweep:
    """A sweep whose every job was prepared on every target: the targets' providers and a fresh
    :class:`RunOptions` per job (the sweep sets each job's own ``max_usd``)."""

    spec: JobSpec
    targets: list[tuple[str, Provider]]
    options: Callable[[], RunOptions]
    spec_path: str
    #: each grid job's planned job (its data counted once, here), in the grid's order, for :class:`Sweep`
    jobs: list[Job | None] = field(default_factory=list)


def prepare_sweep(spec: Path, grid: Sequence[str], on: Sequence[str], flags: RunFlags | None = None, *,
                  ledger: Ledger | None = None, say: Say = print, note: Say = print) -> PreparedSweep:
    """What :func:`prepare_run` checks before renting, for every job of the grid on every target,
    before anything is rented: the first refusal names its job and stops the sweep. A note said
    for several jobs is said once."""
    from lorapod.compute.sweep import SweepJob, job_specs

    flags = dataclasses.replace(flags or RunFlags(), max_usd=None)  # each job's cap is its share (Sweep)
    ledger = ledger or Ledger()
    base = load_spec(spec, list(flags.set_))
    if base.compute.volume:  # never silently without it: the trials would download everything again
        raise SpecError("sweeps do not mount compute.volume yet (docs/remote.md, Volumes)",
                        hint="--set compute.volume=null for the sweep, or run the trials with `lorapod run --volume`")
    targets = list(on) or [base.compute.provider]
    if SKY in targets:
        raise SpecError("sweeps do not run on sky yet: SkyPilot runs each job's lifecycle itself",
                        hint=f"--on {on_hint()}, or `lorapod run --on sky` per trial")
    said: set[str] = set()

    def once(text: str) -> None:
        if text not in said:
            said.add(text)
            note(text)

    job_flags = dataclasses.replace(flags, set_=())  # already in base
    prepared: list[PreparedRun] = []
    for i, (overrides, job_spec) in enumerate(job_specs(base, grid), 1):
        for target in targets:
            try:
                prepared.append(prepare_run(job_spec, target, job_flags, spec_path=str(spec), ledger=ledger,
                                            say=say, note=once))
            except LorapodError as exc:  # the job named, the hint kept: fix it, or take it off the grid
                exc.message = f"sweep job {i} ({SweepJob(i, overrides).label}) on {target}: {exc.message}"
                exc.args = (exc.message,)
                raise
    first = prepared[: len(targets)]
    base_options = run_options(base, flags)
    return PreparedSweep(base, [(p.target, p.provider) for p in first if p.provider is not None],
                         lambda: dataclasses.replace(base_options, watchdog=dict(base_options.watchdog)), str(spec),
                         [p.job for p in prepared[:: len(targets)]])
