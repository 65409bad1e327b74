"""``lorapod train SPEC``: train locally with the built-in engine, into a run folder.

The CLI sets up the run folder, the processes and what is printed; the training itself is
:func:`lorapod.engine.train`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer
from rich.console import Console

from lorapod.errors import LorapodError
from lorapod.trainers import hint as trainer_hint

# Piped or in a job.log (a remote or `run --on local` job), a line stays one line: rich would wrap
# it at 80 columns, cutting paths and the resume command a user copies.
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def say(message: str) -> None:
    """A line from the engine (rich markup allowed, numbers not highlighted)."""
    console.print(message, highlight=False)


def train(
    spec_file: Path | None = typer.Argument(None, help="The job spec (YAML); not needed with --resume."),
    set_: list[str] = typer.Option([], "--set", help="Override a spec value: --set train.learning_rate=1e-4"),
    report_to: str | None = typer.Option(None, "--report-to", help="Trackers: wandb,tensorboard (comma-separated) "
                                         "or none; overrides the spec's tracking section."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Use this run folder (created if missing)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue a run folder from its newest checkpoint."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: best available)."),
    v_pred: bool = typer.Option(False, "--v-pred", help="SD 1.5/SDXL: train on the v-prediction objective "
                                "(kohya's --v_parameterization; same as --set model.prediction_type=v_prediction)."),
    trainer: str | None = typer.Option(None, "--trainer", help="Train with an external trainer instead of "
                                       f"lorapod's engine: {trainer_hint()}."),
    print_: bool = typer.Option(False, "--print", help="With --trainer: show its files and commands, run nothing."),
    trainer_src: str | None = typer.Option(None, "--trainer-src", help="With --trainer: a checkout of it here "
                                           "(used as is), or a git URL to clone at the pinned commit."),
    processes: int | None = typer.Option(None, "--processes", min=1, help="Train data-parallel in N processes "
                                         "under torchrun (one per GPU; gloo on CPU). Default: compute.gpus when "
                                         "this machine has that many GPUs, else 1."),
    nodes: int = typer.Option(1, "--nodes", min=1, help="Machines taking part (each runs this command)."),
    node_rank: int = typer.Option(0, "--node-rank", min=0, help="This machine's index among --nodes."),
    rendezvous: str | None = typer.Option(None, "--rendezvous", help="host:port of node 0 for --nodes > 1 "
                                          "(torchrun's c10d rendezvous)."),
) -> None:
    """Train a LoRA adapter as the spec says (LLM or image), writing checkpoints, metrics and the adapter."""
    from lorapod import engine
    from lorapod.engine.distributed import World, check_batch, env_world, leave
    from lorapod.rundir import RunDir
    from lorapod.spec import apply_report_to, load_spec

    if v_pred:
        set_ = [*set_, "model.prediction_type=v_prediction"]
    if resume is not None:  # continue with the trainer the run folder was started with
        from lorapod.trainers import for_resume

        trainer = for_resume(RunDir.open(resume), trainer, str(resume), lambda m: console.print(m, markup=False))
    if trainer is not None:
        if resume is not None:  # continue a trainer's run folder from its newest checkpoint
            spec_file, run_dir = RunDir.open(resume).spec_file, resume
        _external(spec_file, set_, run_dir, trainer, print_, trainer_src, report_to)
        return
    if print_:
        raise LorapodError("--print shows an external trainer's job", hint=f"add --trainer {trainer_hint()}")

    world = env_world()  # set by torchrun when this is one of N training processes
    nproc: int | None = None
    runs_made = False
    if resume is not None:
        run = RunDir.open(resume)
        if not world.active and node_rank == 0:  # rank 0 lives on node 0: the only writer
            _own(run)
        spec = apply_report_to(load_spec(run.spec_file, set_), report_to)
    else:
        if spec_file is None:
            raise LorapodError("no spec given", hint="lorapod train SPEC.yaml (or --resume RUN_DIR)")
        spec = apply_report_to(load_spec(spec_file, set_), report_to)
        _data_is_here(spec)  # before a run folder, the model or the Hub (F11: a missing folder said first)
        if not world.active:
            nproc = _process_count(spec, processes, device)
            check_batch(World(0, nproc * nodes), spec.train.grad_accum)  # before anything is created
        if world.active and run_dir is None:
            raise LorapodError("every training process must write to the same run folder",
                               hint="under torchrun pass --run-dir DIR (or use lorapod train SPEC --processes N)")
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            from lorapod.rundir.layout import CHECKPOINTS, SAMPLES

            for sub in (CHECKPOINTS, SAMPLES):
                (run_dir / sub).mkdir(exist_ok=True)
            run = RunDir(run_dir)
        else:
            runs_made = not Path(spec.output.dir).exists()  # `runs/` itself goes too if this run made it
            run = RunDir.create(spec.output.dir, spec.output.name or spec_file.stem)
        if not world.active and node_rank == 0:  # torchrun's processes share the folder their
            _own(run)  # launcher holds; another node's launcher writes nothing there (rank 0 is on node 0)
        if world.is_main:
            run.write_spec(spec)
            _record_plan(spec, run)
    if not world.active:
        if nproc is None:  # --resume: the spec comes from the run folder
            nproc = _process_count(spec, processes, device)
            check_batch(World(0, nproc * nodes), spec.train.grad_accum)
        if nproc > 1 or nodes > 1:
            from lorapod.cli.scale import launch_processes

            console.print(f"run folder: [bold]{run.root}[/] ({nproc} process(es) x {nodes} node(s))")
            launch_processes(run, spec_file, resume is not None, set_, device, nproc, nodes, node_rank, rendezvous)
            return
    if not world.is_main:
        engine.train(spec, run, resume=resume is not None or bool(run.checkpoints_by_step()), device=device, log=say)
        leave()
        return
    console.print(f"run folder: [bold]{run.root}[/]")
    _one_thread_for_builtin(spec, device)
    resume_flag = resume is not None or (run_dir is not None and bool(run.checkpoints_by_step()))
    created = resume is None and run_dir is None
    with interrupt_says_how_to_resume(), _removed_if_nothing_trained(run, created, created and runs_made):
        result = engine.train(spec, run, resume=resume_flag, device=device, log=say)
    leave()  # every process of a data-parallel run, before rank 0's own work below
    _learn(run)
    for key, label in (("val_loss", "validation loss"), ("fixed_noise_loss", "fixed-noise loss")):  # LLM, image
        first = (result.first_eval or {}).get(key)
        last = (result.last_eval or {}).get(key)
        if first is not None and last is not None:
            console.print(f"{label}: base {loss_text(first)} -> tuned {loss_text(last)}")
    if result.stopped == "stop_file":
        console.print(f"stopped on request at step {result.state.step}; resume with: lorapod train --resume {run.root}")
    else:
        console.print(f"adapter: [bold]{run.adapter}[/]")
    _say_quality(run)
    _say_tracking(run)


def _say_quality(run) -> None:
    """The quality autopilot's pick, which `lorapod export` takes by default (quality/pick.json)."""
    from lorapod.rundir.quality import pick_summary

    q = pick_summary(run.root)
    if q and q.get("checkpoint"):
        at = f" at strength {q['strength']:g}" if q.get("strength") is not None else ""
        console.print(f"quality pick: [bold]{q['checkpoint']}{at}[/] (lorapod export takes it by default; "
                      f"lorapod eval {run.root} shows the scores)", highlight=False)


def loss_text(x: float) -> str:
    """A loss as a person reads it: three decimals, or three significant figures below 0.1, so a
    tuned loss of 0.0004 is not printed as 0.000 (issue 48, F24)."""
    return f"{x:.3f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3g}"


def _data_is_here(spec) -> None:
    """Refuse a spec whose data.path (or data.val_path) is not on this machine, naming it, before
    anything slow: loading the base model may first wait on the Hugging Face Hub for a minute."""
    from lorapod.errors import DataError

    paths = [Path(p) for p in spec.data_paths()] + ([Path(spec.data.val_path)] if spec.data.val_path else [])
    missing = [p for p in paths if not p.exists()]
    if not missing:
        return
    what = "folder of images (photo01.jpg + photo01.txt ...)" if spec.is_image else "chat file (.jsonl)"
    raise DataError(f"data path {missing[0]} does not exist" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                                               else ""),
                    hint=f"put your {what} there, or point the spec at yours: --set data.path=PATH; "
                         "`lorapod data check PATH` checks it first")


def _one_thread_for_builtin(spec, device: str | None) -> None:
    """lorapod's built-in tiny models (``lorapod:tiny-llama``, what examples/demo.yaml trains) on CPU:
    one intra-op thread, as the demos use. Their matmuls are too small for threads to pay and on a
    busy machine OpenMP's spinning threads contend: on this project's loaded 2-core box the demo's
    first 40 steps took 47 s on one thread and 245 s on two. OMP_NUM_THREADS, when set, wins."""
    import os

    from lorapod.catalog.models import is_builtin

    if is_builtin(str(spec.model.id)) and device in (None, "cpu") and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def trained_anything(run) -> bool:
    """Whether a run folder holds any training: a checkpoint, an adapter or a step in its metrics."""
    if bool(run.checkpoints_by_step()) or (run.adapter / "adapter_model.safetensors").is_file():
        return True
    from lorapod.rundir import read_records

    return any("loss" in rec for rec in read_records(run.metrics_file))


@contextlib.contextmanager
def _removed_if_nothing_trained(run, created_here: bool, parent_made: bool = False):
    """A start that fails before the first step (a bad data path, a model that is not there) takes
    its new run folder with it, so `runs/` holds only runs, and `runs/` itself when this run made it
    and nothing else is in it; a --run-dir or --resume folder is the user's and stays."""
    try:
        yield
    except BaseException:
        if created_here and not trained_anything(run):
            import shutil

            shutil.rmtree(run.root, ignore_errors=True)
            if parent_made:
                with contextlib.suppress(OSError):  # not empty: another run started there meanwhile
                    run.root.parent.rmdir()
            console.print(f"nothing was trained: removed {run.root}", markup=False, highlight=False, soft_wrap=True)
        raise


@contextlib.contextmanager
def interrupt_says_how_to_resume(out: Console = console):
    """Ctrl-C / SIGTERM during training (engine/loop.py saved a checkpoint): say what was saved and the
    exact line that continues, and exit 130 (128 + SIGINT, what shells and CI read as interrupted) for
    Ctrl-C, 75 (:data:`lorapod.errors.PREEMPTED_EXIT`: preempted, saved) for SIGTERM."""
    from lorapod.engine.loop import Interrupted

    try:
        yield
    except Interrupted as exc:
        saved = (f"checkpoint saved: {exc.checkpoint}" if exc.checkpoint is not None
                 else "nothing trained yet, no checkpoint")
        out.print(f"interrupted ({exc.how}) at step {exc.step}; {saved}", markup=False, highlight=False, soft_wrap=True)
        if exc.checkpoint is not None:
            out.print(f"resume with: lorapod train --resume {exc.run_root}", markup=False, highlight=False,
                      soft_wrap=True)  # one line, never wrapped: it is pasted back
        sys.exit(exc.exit_code)


def _say_tracking(run) -> None:
    """Where the run's W&B page is (or how to upload an offline run)."""
    from lorapod.engine.trackers import read_tracking

    info = read_tracking(run.root).get("wandb")
    if info and info.get("url"):
        console.print(f"W&B: {info['url']}", markup=False)
    elif info and info.get("dir"):
        console.print(f"W&B (offline): upload with `wandb sync {run.root / info['dir']}`", markup=False)


def _external(spec_file, set_, run_dir, trainer: str, print_: bool, trainer_src: str | None,
              report_to: str | None = None) -> None:
    """``--trainer X``: print its job, or run it here under the run-folder contract."""
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec
    from lorapod.trainers.on_instance import print_trainer_job

    if spec_file is None:
        raise LorapodError("no spec given", hint="lorapod train SPEC.yaml --trainer NAME [--print]")
    from lorapod.spec import apply_report_to

    spec = apply_report_to(load_spec(spec_file, set_), report_to)
    if print_:
        typer.echo(print_trainer_job(spec, trainer), nl=False)
        return
    from lorapod.trainers.runner import run_trainer

    run = RunDir(run_dir) if run_dir is not None else RunDir.create(spec.output.dir, spec.output.name or spec_file.stem)
    run.root.mkdir(parents=True, exist_ok=True)
    _own(run)
    run.write_spec(spec)
    from lorapod.trainers import canonical

    run.write_trainer(canonical(trainer))
    console.print(f"run folder: [bold]{run.root}[/]")
    import sys

    work = run.root.parent / f".{run.root.name}-trainer"
    state = run_trainer(spec, trainer, run.root, work, python=sys.executable, src=trainer_src,
                        say=lambda m: console.print(m, markup=False))
    console.print(f"{state}: adapter in {run.adapter}" if state == "done" else
                  f"{'preempted (SIGTERM)' if state == 'preempted' else 'stopped on request'}; continue with: "
                  f"lorapod train --resume {run.root} --trainer {trainer}")
    if state == "preempted":
        from lorapod.errors import PREEMPTED_EXIT

        sys.exit(PREEMPTED_EXIT)


def _own(run) -> None:
    """Be the run folder's only writer until this process ends (rundir.WriterLock): a second
    `lorapod train` on it is refused with who holds it; a lock left by a dead one is taken over."""
    import atexit

    lock = run.lock(say=lambda m: console.print(m, markup=False))
    atexit.register(lock.release)


def _process_count(spec, processes: int | None, device: str | None) -> int:
    """--processes, else compute.gpus when this machine has that many GPUs (and --device allows)."""
    if processes is not None:
        return processes
    gpus = spec.compute.gpus
    if gpus <= 1:
        return 1
    import torch

    have = torch.cuda.device_count() if (device is None or device.startswith("cuda")) else 0
    if have >= gpus:
        return gpus
    console.print(f"compute.gpus is {gpus} but this machine has {have} GPU(s): training in one process "
                  f"(--processes {gpus} runs {gpus} processes anyway, e.g. on CPU)")
    return 1


def _learn(run) -> None:
    """Keep this run's measured speed for the planner (plan/learned.py); say in events.log why not."""
    import sqlite3

    from lorapod.plan.learned import record_local

    try:
        measured, why = record_local(run.root)
    except (LorapodError, OSError, sqlite3.Error) as exc:
        measured, why = None, str(exc)
    run.event(f"planner: learned from this run ({why})" if measured else f"planner: not learned from this run: {why}")


def _record_plan(spec, run) -> None:
    """Write what the planner predicts for this job into plan.json, when it can say."""
    try:
        from lorapod.compute.provider import load_facts
        from lorapod.plan.choose import plan_job

        load_facts()  # how each provider bills (their classes' Billing)
        run.write_plan(plan_job(spec).to_record())
    except LorapodError as exc:  # a model the catalog does not know, say: training goes on
        run.event(f"no plan.json: {exc.message}")


def register(app: typer.Typer) -> None:
    from lorapod.cli.helptext import renew_option_help

    renew_option_help(train, "trainer", f"Train with an external trainer instead of lorapod's engine: {trainer_hint()}.")  # a trainer registered since this module's import too
    app.command("train")(train)
