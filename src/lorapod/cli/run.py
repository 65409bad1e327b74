"""``lorapod run``: train a spec on a rented or borrowed machine and bring everything home.

Thin: parsing and printing only; the lifecycle is :mod:`lorapod.compute.session`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        spec: Path | None = typer.Argument(None, help="The job spec (YAML). Not needed with --resume."),
        on: str | None = typer.Option(None, "--on", help="vast | runpod | local | ssh://user@host:port "
                                      "(default: spec.compute.provider)."),
        identity: Path | None = typer.Option(None, "--identity", help="SSH private key (default: a fresh "
                                             "ed25519 key pair per job on clouds; your SSH defaults on ssh://)."),
        gpu: str | None = typer.Option(None, "--gpu", help="Pin a GPU model, e.g. 'RTX 3090'."),
        max_usd: float | None = typer.Option(None, "--max-usd", help="Dollar cap: checkpoint, pull and destroy "
                                             "before it is crossed."),
        max_hours: float | None = typer.Option(None, "--max-hours", help="Hour cap, same behaviour."),
        resume: str | None = typer.Option(None, "--resume", help="Continue JOB from its last pulled checkpoint "
                                          "on a new instance."),
        set_: list[str] = typer.Option([], "--set", help="Override a spec value: dotted.key=value."),
        report_to: str | None = typer.Option(None, "--report-to", help="Trackers: wandb,tensorboard (comma-"
                                             "separated) or none; overrides the spec's tracking section."),
        bootstrap: str = typer.Option("source", "--bootstrap", help="How lorapod gets onto the instance: "
                                      "source (copy this package) | wheel (build and pip install a wheel)."),
        python: str = typer.Option("auto", "--python", help="The instance's Python, from which the job's "
                                   "environment is built (auto: found on PID 1's PATH, the SSH PATH or where "
                                   "images keep one; the choice is printed)."),
        deps: str = typer.Option("auto", "--deps", help="auto: install what the job needs where --python lacks "
                                 "it (a cached virtualenv keeping the image's torch) | none: use --python as it is."),
        image: str | None = typer.Option(None, "--image", help="Container image for runpod/vast "
                                         "(default: compute.image, else lorapod's per provider)."),
        force: bool = typer.Option(False, "--force", help="Rent even when `lorapod data check` finds errors."),
        usd_per_hour: float | None = typer.Option(None, "--usd-per-hour", help="For ssh hosts: what the "
                                                  "machine costs, so caps and `ps` show dollars."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        forward_env: list[str] = typer.Option([], "--forward-env", help="Send this environment variable to the "
                                              "instance (repeatable; to any host). Default: only HF_TOKEN for a "
                                              "gated model, and only to verified/secure hosts."),
        trainer: str | None = typer.Option(None, "--trainer", help="Run an external trainer on the instance: "
                                           "sd-scripts | ai-toolkit | musubi-tuner | axolotl."),
        trainer_src: str | None = typer.Option(None, "--trainer-src", help="With --trainer: a checkout already on "
                                               "the instance (used as is), or a git mirror URL."),
        gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs per instance (compute.gpus); above 1 "
                                        "the job trains data-parallel under torchrun."),
        dry_run: bool = typer.Option(False, "--dry-run", help="--on sky: build and write the SkyPilot task only."),
        volume: str | None = typer.Option(None, "--volume", help="RunPod network volume NAME (compute.volume): "
                                          "found or created where the GPU is; keeps model, environment and "
                                          "latent caches between sessions ($0.07/GB-month, docs/remote.md)."),
        poll_s: float = typer.Option(5.0, "--poll-s", hidden=True),
        pull_every_s: float = typer.Option(30.0, "--pull-every-s", hidden=True),
        ready_deadline_s: float = typer.Option(1500.0, "--ready-deadline-s", hidden=True),
        stop_margin_s: float = typer.Option(120.0, "--stop-margin-s", hidden=True),
        stop_wait_s: float = typer.Option(300.0, "--stop-wait-s", hidden=True),
        reconnect_s: float = typer.Option(600.0, "--reconnect-s", hidden=True),
        heartbeat_timeout_s: float = typer.Option(600.0, "--heartbeat-timeout-s", hidden=True),
        watchdog_poll_s: float = typer.Option(10.0, "--watchdog-poll-s", hidden=True),
        stall_s: float = typer.Option(1800.0, "--stall-s", hidden=True),
        destroy_deadline_s: float = typer.Option(300.0, "--destroy-deadline-s", hidden=True),
    ) -> None:
        """Run SPEC on a rented GPU or any SSH host; always destroyed at the end, on failure, or at the caps.

        The instance is destroyed when the job ends, fails, stalls, is interrupted, or would cross
        --max-usd / --max-hours; checkpoints, samples and metrics are pulled as they appear."""
        from lorapod.compute.launch import job_command_for
        from lorapod.compute.ledger import Ledger
        from lorapod.compute.provider import from_target
        from lorapod.compute.remote import Bootstrap
        from lorapod.compute.session import RunOptions, run_remote
        from lorapod.errors import SpecError
        from lorapod.spec import apply_report_to, load_spec

        ledger = Ledger()
        target = on
        set_ = [*set_, f"compute.gpus={gpus}"] if gpus else set_
        if resume:
            from lorapod.compute.jobs import find_job

            job = find_job(ledger, resume)
            resume = job.id
            from lorapod.compute.ledger import controller_alive

            if job.state in ("starting", "running", "stopping") and controller_alive(job.controller):
                raise SpecError(f"job {job.id} is still running (controller {job.controller})",
                                hint=f"follow it with `lorapod logs -f {job.id}`, or stop it with `lorapod down {job.id}`")
            spec_obj = load_spec(Path(job.run_dir) / "spec.yaml", set_)
            target = on or job.target or job.provider
            spec_path = job.spec_path
            from lorapod.rundir import RunDir
            from lorapod.trainers import for_resume

            trainer = for_resume(RunDir(Path(job.run_dir)), trainer, f"job {job.id}",
                                 lambda m: console.print(m, markup=False))
        else:
            if spec is None:
                raise SpecError("no spec given", hint="lorapod run SPEC --on ..., or lorapod run --resume JOB")
            spec_obj = load_spec(spec, set_)
            spec_path = str(spec)
            target = on or spec_obj.compute.provider
        spec_obj = apply_report_to(spec_obj, report_to)
        if target in (None, ""):
            raise SpecError("where should it run?", hint="--on vast | runpod | ssh://user@host:port")
        if spec_obj.is_video and not resume:  # before renting: the clips give windows, the job fits the GPU
            from lorapod.engine.diffusion.video_preflight import preflight

            preflight(spec_obj, gpu or spec_obj.compute.gpu, say=lambda m: console.print(m, style="dim", markup=False))
        if target == "sky":  # SkyPilot runs the lifecycle itself (compute/skypilot.py)
            from lorapod.compute.skypilot import run_on_sky

            sky_run = run_on_sky(spec_obj, gpu, dry_run, say=lambda m: console.print(m, markup=False))
            console.print(f"run folder: {sky_run.root}", markup=False)
            return
        if bootstrap not in ("source", "wheel"):
            raise SpecError(f"--bootstrap {bootstrap!r}", hint="source | wheel")
        if deps not in ("auto", "none"):
            raise SpecError(f"--deps {deps!r}", hint="auto | none")
        if image:
            spec_obj.compute.image = image
        if volume:
            spec_obj.compute.volume = volume
        kwargs = {}
        if target.startswith("ssh://"):
            kwargs = {"identity": identity, "usd_per_hour": usd_per_hour or spec_obj.compute.usd_per_hour or 0.0}
        elif target == "local":
            kwargs = {"usd_per_hour": usd_per_hour or spec_obj.compute.usd_per_hour or 0.0}
        provider = from_target(target, **kwargs)
        if trainer:  # what the trainer cannot do is refused first, before the data check and renting
            from lorapod.trainers.on_instance import print_trainer_job, trainer_job_command

            print_trainer_job(spec_obj, trainer)
        from lorapod.compute.preflight import preflight

        for note in preflight(spec_obj, provider.name, force=force, deps=deps).notes:  # refuses before anything is rented
            console.print(f"note: {note}", style="yellow", markup=False)
        from lorapod.compute.doctor import doctor_note

        if note := doctor_note(ledger, provider.name):
            console.print(f"note: {note}", style="yellow", markup=False)
        if spec_obj.compute.volume:  # after the checks above: a new volume bills from its creation
            from lorapod.compute.runpod.volume_mount import attach

            attach(provider, spec_obj, spec_obj.compute.volume, gpu, max_usd, max_hours,
                   say=lambda m: console.print(m, style="dim", markup=False))
        opts = RunOptions(identity=identity, gpu=gpu, max_usd=max_usd, max_hours=max_hours,
                       bootstrap=Bootstrap(bootstrap, python, deps), poll_s=poll_s, pull_every_s=pull_every_s,
                       ready_deadline_s=ready_deadline_s, stop_margin_s=stop_margin_s, stop_wait_s=stop_wait_s,
                       reconnect_s=reconnect_s, job_command=job_command_for(spec_obj.compute.gpus),
                       watchdog={"heartbeat_timeout_s": heartbeat_timeout_s,
                                 "poll_s": watchdog_poll_s, "stall_s": stall_s},
                       forward_env=tuple(forward_env) if forward_env else None,
                       destroy_deadline_s=destroy_deadline_s)
        if trainer:  # the trainer's wrapper replaces lorapod's engine on the instance
            opts.job_command = trainer_job_command(trainer, trainer_src)
            from lorapod.trainers import canonical

            opts.trainer = canonical(trainer)
        summary = run_remote(spec_obj, provider, target, opts, ledger, spec_path,
                             say=lambda m: console.print(m, style="dim", markup=False), resume_job=resume)
        if as_json:
            typer.echo(json.dumps(summary.to_dict()))
        else:
            color = {"done": "green", "stopped": "yellow"}.get(summary.state, "red")
            console.print(f"[bold {color}]{summary.state}[/]: {escape(summary.message)}")
            console.print(f"run folder: {summary.run_dir}", markup=False)
            if summary.wandb_url:
                console.print(f"W&B: {summary.wandb_url}", markup=False)
        if summary.unconfirmed:
            # Never a quiet success while something may bill: the id, where to look, what to run.
            console.print(f"[bold red]instance {escape(summary.unconfirmed)} was NOT confirmed destroyed and may "
                          f"still bill.[/] Check {escape(summary.console or '')} and run "
                          f"`lorapod down {escape(summary.job_id)}`")
            sys.exit(3)
        if summary.state not in ("done", "stopped"):
            # sys.exit, not typer.Exit: the entry point runs click with standalone_mode=False,
            # which would swallow typer.Exit's status.
            sys.exit(130 if summary.state == "interrupted" else 1)
