"""``lorapod run``: train a spec on a rented or borrowed machine and bring everything home.

Thin: parsing and printing only. What happens before renting (resume lookup, the provider, the
pre-flights, the trainer) is :func:`lorapod.compute.prepare.prepare_run`; the lifecycle is
:mod:`lorapod.compute.session`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from lorapod.compute.provider import on_hint  # the registry's names (built-ins and plugins), for the help
from lorapod.trainers import hint as trainer_hint

console = Console(stderr=True, highlight=False)


def dim(message: str) -> None:
    """A progress line (the lifecycle's, the checks')."""
    console.print(message, style="dim", markup=False)


def given(**values: float | None) -> dict[str, float]:
    """The options a command line set (a None was left out, so the library's default holds)."""
    return {k: v for k, v in values.items() if v is not None}


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        spec: Path | None = typer.Argument(None, help="The job spec (YAML). Not needed with --resume."),
        on: str | None = typer.Option(None, "--on", help=f"{on_hint()} (default: spec.compute.provider)."),
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
        image: str | None = typer.Option(None, "--image", help="Container image for a rented instance "
                                         "(default: compute.image, else lorapod's per provider)."),
        force: bool = typer.Option(False, "--force", help="Rent even when `lorapod data check` finds errors."),
        usd_per_hour: float | None = typer.Option(None, "--usd-per-hour", help="For ssh hosts: what the "
                                                  "machine costs, so caps and `ps` show dollars."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        forward_env: list[str] = typer.Option([], "--forward-env", help="Send this environment variable to the "
                                              "instance (repeatable; to any host). Default: only HF_TOKEN for a "
                                              "gated model, and only to verified/secure hosts."),
        trainer: str | None = typer.Option(None, "--trainer", help="Run an external trainer on the instance: "
                                           f"{trainer_hint()}."),
        trainer_src: str | None = typer.Option(None, "--trainer-src", help="With --trainer: a checkout already on "
                                               "the instance (used as is), or a git mirror URL."),
        gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs per instance (compute.gpus); above 1 "
                                        "the job trains data-parallel under torchrun."),
        dry_run: bool = typer.Option(False, "--dry-run", help="--on sky: build and write the SkyPilot task only."),
        volume: str | None = typer.Option(None, "--volume", help="RunPod network volume NAME (compute.volume): "
                                          "found or created where the GPU is; keeps model, environment and "
                                          "latent caches between sessions ($0.07/GB-month, docs/remote.md)."),
        spot: str | None = typer.Option(None, "--spot", help="never | auto | always (overrides compute.spot): "
                                        "auto rents spot when the plan's worst end still beats on-demand; on spot "
                                        "each preemption resumes on the next instance under the one cap."),
        preempt_confirm_s: float | None = typer.Option(None, "--preempt-confirm-s", hidden=True),
        spot_resume_wait_s: float | None = typer.Option(None, "--spot-resume-wait-s", hidden=True),
        poll_s: float | None = typer.Option(None, "--poll-s", hidden=True),
        pull_every_s: float | None = typer.Option(None, "--pull-every-s", hidden=True),
        ready_deadline_s: float | None = typer.Option(None, "--ready-deadline-s", hidden=True),
        stop_margin_s: float | None = typer.Option(None, "--stop-margin-s", hidden=True),
        stop_wait_s: float | None = typer.Option(None, "--stop-wait-s", hidden=True),
        reconnect_s: float | None = typer.Option(None, "--reconnect-s", hidden=True),
        heartbeat_timeout_s: float | None = typer.Option(None, "--heartbeat-timeout-s", hidden=True),
        watchdog_poll_s: float | None = typer.Option(None, "--watchdog-poll-s", hidden=True),
        stall_s: float | None = typer.Option(None, "--stall-s", hidden=True),
        destroy_deadline_s: float | None = typer.Option(None, "--destroy-deadline-s", hidden=True),
    ) -> None:
        """Run SPEC on a rented GPU or any SSH host; always destroyed at the end, on failure, or at the caps.

        The instance is destroyed when the job ends, fails, stalls, is interrupted, or would cross
        --max-usd / --max-hours; checkpoints, samples and metrics are pulled as they appear."""
        from lorapod.compute.prepare import RunFlags, prepare_run
        from lorapod.compute.session import run_remote

        # The hidden knobs left unset keep RunOptions' (and the watchdog's) defaults.
        knobs = given(poll_s=poll_s, pull_every_s=pull_every_s, ready_deadline_s=ready_deadline_s,
                      stop_margin_s=stop_margin_s, stop_wait_s=stop_wait_s, reconnect_s=reconnect_s,
                      destroy_deadline_s=destroy_deadline_s, preempt_confirm_s=preempt_confirm_s,
                      spot_resume_wait_s=spot_resume_wait_s)
        if spot is not None and spot not in ("never", "auto", "always"):
            from lorapod.errors import SpecError

            raise SpecError(f"--spot {spot!r}", hint="never | auto | always")
        watchdog = given(heartbeat_timeout_s=heartbeat_timeout_s, poll_s=watchdog_poll_s, stall_s=stall_s)
        flags = RunFlags(set_=set_, report_to=report_to, identity=identity, gpu=gpu, gpus=gpus, max_usd=max_usd,
                         max_hours=max_hours, bootstrap=bootstrap, python=python, deps=deps, image=image,
                         volume=volume, force=force, usd_per_hour=usd_per_hour, forward_env=forward_env,
                         trainer=trainer, trainer_src=trainer_src, knobs=knobs, watchdog=watchdog, spot=spot)
        prepared = prepare_run(spec, on, flags, resume_job=resume, say=dim,
                               note=lambda m: console.print(f"note: {m}", style="yellow", markup=False))
        if prepared.on_sky:
            from lorapod.compute.skypilot import run_on_sky

            sky_run = run_on_sky(prepared.spec, gpu, dry_run, say=lambda m: console.print(m, markup=False))
            console.print(f"run folder: {sky_run.root}", markup=False)
            return
        summary = run_remote(prepared.spec, prepared.provider, prepared.target, prepared.options, prepared.ledger,
                             prepared.spec_path, say=dim, resume_job=prepared.resume_job, job=prepared.job)
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
