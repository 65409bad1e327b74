"""The training loop every recipe shares: accumulate, clip, step, log, evaluate, checkpoint, resume.

A recipe (LLM, diffusion) says *what* a batch and a loss are; this loop says *how* training
proceeds, so checkpointing, exact resume, metrics, the STOP file and the progress bar behave the
same for every family.

Exact resume rests on three rules:
1. a recipe's batches for an epoch depend only on the seed and the epoch number, never on the
   global RNG, so the data position is just (epoch, micro-batch index);
2. checkpoints are taken at optimizer-step boundaries, with every RNG state captured;
3. the loss of an accumulation window is normalised by the units (label tokens, samples) of the
   whole window, known before the forward pass, so splitting a window never changes the gradient.

The same rules make it data-parallel (:mod:`lorapod.engine.distributed`): under torchrun each
process takes its share of every window, DDP sums the gradients, and only rank 0 writes metrics,
events, checkpoints, samples and the adapter.
"""

from __future__ import annotations

import contextlib
import gc
import math
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from lorapod.engine import distributed
from lorapod.engine.checkpoint import Checkpoint, CheckpointManager, TrainState, capture_rng, restore_rng
from lorapod.engine.device import (
    Precision,
    describe_device,
    device_memory_gb,
    memory_stats,
    peak_memory_gb,
    peak_reserved_gb,
    reset_peak_memory,
)
from lorapod.engine.metrics import MetricsWriter
from lorapod.engine.optim import build_optimizer, build_scheduler
from lorapod.engine.plots import plot_metrics
from lorapod.engine.progress import TrainProgress
from lorapod.engine.trackers import open_trackers
from lorapod.errors import PREEMPTED_EXIT, LorapodError, OutOfMemory
from lorapod.rundir import STOP, RunDir
from lorapod.spec import JobSpec

STOP_FILE = STOP  # touch <run>/STOP: the job saves a checkpoint and exits cleanly (rundir/layout.py)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended ``fit``, after the checkpoint was saved: what the CLI tells the user.

    A KeyboardInterrupt still (so every ``except KeyboardInterrupt`` keeps working), with the step,
    the checkpoint and which signal it was. ``exit_code``: 130 for Ctrl-C, :data:`PREEMPTED_EXIT`
    for SIGTERM (preempted, saved)."""

    def __init__(self, how: str, step: int, checkpoint: Path | None, run_root: Path) -> None:
        super().__init__(f"{how} at step {step}")
        self.how, self.step, self.checkpoint, self.run_root = how, step, checkpoint, run_root

    @property
    def exit_code(self) -> int:
        return PREEMPTED_EXIT if self.how == "SIGTERM" else 130


class _Signals:
    """What the handlers saw: ``pending`` names each signal; ``term`` is set by SIGTERM; while
    ``deferred`` (between the optimizer's step and the step's bookkeeping) a Ctrl-C is only noted."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.term = False
        self.deferred = False

    def __bool__(self) -> bool:  # a Ctrl-C waiting to be acted on
        return "SIGINT" in self.pending


@contextlib.contextmanager
def _interrupts_as_ctrl_c():
    """SIGINT (Ctrl-C) and SIGTERM (a spot preemption; what ``timeout``, SLURM and Kubernetes send
    before SIGKILL) end training with a checkpoint, then out.

    SIGTERM only sets a flag (:class:`_Signals`): the loop looks at it between micro-batches and
    after each step, and saves a checkpoint of the last whole step. Why not raise at once: an
    exception at an arbitrary point could land between the optimizer's step and the step count,
    saving weights of step k+1 labelled k, or cut a metrics line in two; a flag read at safe points
    cannot. The wait is at most one micro-batch (the planner checks one micro-batch plus the save fits
    the provider's grace window: plan/spot.py). Under torchrun the processes agree on it once per
    step, as with the STOP file.

    SIGINT raises KeyboardInterrupt (a person at a terminal wants it now), except inside the
    step's bookkeeping, where it is noted and acted on before the next step; the loop also checks
    the notes before every step: Python drops, with an "Exception ignored" line, a
    KeyboardInterrupt raised while it runs a ``__del__`` or a weakref callback, and a Ctrl-C lost
    that way left a run training on (seen once in CI). A SIGINT that was ignored when training
    began (a background job of a shell) stays ignored. Python only lets the main thread set
    handlers."""
    seen = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        if signum == signal.SIGTERM:
            seen.pending.append("SIGTERM")
            seen.term = True
            return
        seen.pending.append("SIGINT")
        if not seen.deferred:
            raise KeyboardInterrupt

    sigs = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else [])
    old = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield seen
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


class _Preempted(Exception):
    """SIGTERM seen at a safe point: leave the loop and save the last whole step."""


@contextlib.contextmanager
def _signals_held():
    """While the interrupted run saves its checkpoint, a second Ctrl-C or SIGTERM does not cut the
    save short (the save is seconds; SIGKILL still ends it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@dataclass
class LossOut:
    """A micro-batch's summed loss and what it covered."""

    loss_sum: torch.Tensor  # sum over units (e.g. per-token NLL summed), not a mean
    units: int  # what loss_sum is a sum over (label tokens, samples)
    tokens: int = 0  # tokens processed, padding included (LLM)
    real_tokens: int = 0  # non-padding tokens (LLM)


class Recipe(Protocol):
    unit: str  # progress unit: "tok/s" or "it/s"

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...
    def epoch_batches(self, epoch: int) -> Sequence[Any]: ...
    def batch_units(self, batch: Any) -> int: ...
    def loss(self, batch: Any) -> LossOut: ...
    def evaluate(self) -> dict[str, float]: ...
    def train(self) -> None: ...
    def adapter_state(self) -> dict[str, torch.Tensor]: ...
    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None: ...
    def save_final(self, out_dir: Path) -> None: ...
    def on_save(self, state: TrainState, path: Path | None) -> None: ...


class CheckpointJudge(Protocol):
    """What scores each checkpoint where it is made (the quality autopilot, quality/autopilot.py):
    called after every save (and once after a resume) with the step, the planned total and the
    metrics log; returns why training should stop now (``train.stop_when``), or None."""

    def on_checkpoint(self, step: int, total_steps: int,
                      metrics: Callable[[dict[str, Any]], None] | None = None) -> str | None: ...

    def keep(self) -> set[str]: ...


@dataclass
class FitResult:
    state: TrainState
    stopped: str  # "done" | "max_steps" | "stop_file" | "stop_when" | "interrupted" | "out_of_memory"
    first_eval: dict[str, float] | None = None
    last_eval: dict[str, float] | None = None
    losses: list[float] = field(default_factory=list)
    checkpoint: Path | None = None
    stop_reason: str | None = None  # train.stop_when's, when it ended the run


def steps_per_epoch(n_micro_batches: int, grad_accum: int) -> int:
    return math.ceil(n_micro_batches / grad_accum)


def fit(
    recipe: Recipe,
    spec: JobSpec,
    run: RunDir,
    precision: Precision,
    *,
    resume: Checkpoint | None = None,
    on_step: Callable[[TrainState, float], None] | None = None,
    show_progress: bool | None = None,
    judge: CheckpointJudge | None = None,
) -> FitResult:
    """Train ``recipe`` as ``spec`` says, writing checkpoints and metrics into ``run``. ``judge``
    (rank 0's only) scores every checkpoint and may end training early (``train.stop_when``): the
    run then finishes as if it had reached its last step, at that checkpoint."""
    train = spec.train
    device = precision.device
    world = distributed.current()
    distributed.check_batch(world, train.grad_accum)
    event = world.only_main(run.event)
    n_micro = len(recipe.epoch_batches(0))
    per_epoch = steps_per_epoch(n_micro, train.grad_accum)
    total_steps = train.max_steps or train.epochs * per_epoch
    n_epochs = math.ceil(total_steps / per_epoch)

    params = recipe.trainable_parameters()
    ddp = distributed.data_parallel(params, recipe.loss, device) if world.active else None
    optimizer = build_optimizer(params, train, device)
    scheduler = build_scheduler(optimizer, train, total_steps)
    scaler = torch.amp.GradScaler("cuda") if precision.needs_grad_scaler else None
    # the autopilot's pick outlives keep_last: "the best LoRA is often not the last one"
    ckpts = CheckpointManager(run.checkpoints, keep_last=spec.save.keep_last,
                              protect=judge.keep if judge is not None else None)

    state = TrainState()
    result = FitResult(state=state, stopped="done")
    # rank 0 reads the checkpoint and sends it to the others (nodes need not share a disk)
    loaded = None
    if resume is not None and world.is_main:
        loaded = (resume.adapter(), resume.optimizer(), resume.rng(), resume.state, resume.path.name)
    loaded = world.broadcast(loaded)
    if loaded is not None:
        adapter, opt_state, rng, resumed_state, name = loaded
        recipe.load_adapter_state(adapter)
        optimizer.load_state_dict(opt_state["optimizer"])
        scheduler.load_state_dict(opt_state["scheduler"])
        if scaler is not None and "scaler" in opt_state:
            scaler.load_state_dict(opt_state["scaler"])
        restore_rng(rng)
        state = result.state = resumed_state
        before = state.extra.get("processes", 1)
        event(f"resumed from {name} (step {state.step}, epoch {state.epoch})"
              + (f" with {world.size} process(es); saved with {before}" if before != world.size else ""))
    state.extra["processes"] = world.size

    if world.is_main:
        run.write_device(describe_device(device, world.size, state.step))
        metrics: MetricsWriter | _NoMetrics = MetricsWriter(
            run.metrics_file, resume_step=state.step if loaded else None,
            trackers=open_trackers(spec, run, run.event), event=run.event)
        metrics.samples(run.samples, state.step)  # what is there already was logged before
    else:
        metrics = _NoMetrics()

    eval_step = -1

    def evaluate() -> dict[str, float]:
        nonlocal eval_step
        eval_step = state.step
        ev = recipe.evaluate()
        recipe.train()
        if ev:
            metrics.log({"step": state.step, "epoch": state.epoch, "event": "eval", **ev})
            progress.val_loss = ev.get("val_loss", progress.val_loss)  # shown from now on
        return ev

    def save(rng: dict[str, Any] | None = None, judged: bool = True) -> Path | None:
        """``judged``: the judge scores this checkpoint (not one saved on the way out of an
        interrupt or an out-of-memory error)."""
        if not world.is_main:  # the others hold the same weights and optimizer state
            return None
        opt_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        if scaler is not None:
            opt_state["scaler"] = scaler.state_dict()
        path = ckpts.save(state, recipe.adapter_state(), opt_state, rng=rng)
        run.event(f"checkpoint {path.name}")
        metrics.log({"step": state.step, "epoch": state.epoch, "event": "checkpoint", "path": str(path.relative_to(run.root))})
        recipe.on_save(state, path)
        result.checkpoint = path
        if judged:
            judge_now()
        return path

    def judge_now() -> None:
        if judge is None or result.stop_reason is not None:
            return
        why = judge.on_checkpoint(state.step, total_steps, metrics.log)
        recipe.train()  # scoring drew images or answers in eval mode
        if why is not None:
            result.stop_reason = why
            run.event(f"train.stop_when: stopping at step {state.step}: {why}")

    progress = TrainProgress(total_steps, state.step, spec.compute.usd_per_hour, recipe.unit,
                             enabled=show_progress if world.is_main else False, usd_cap=spec.compute.max_usd)
    if loaded is not None and world.is_main:  # the checkpoint resumed from: scored unless it was
        judge_now()
    recipe.train()
    if loaded is None and spec.eval.at_start:
        try:
            result.first_eval = evaluate()
        except torch.OutOfMemoryError as exc:  # the base model's evaluation, before any step: same advice
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
            traceback.clear_frames(exc.__traceback__)
            peak = peak_memory_gb(device)
            recipe.train()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            event(f"out of GPU memory evaluating the base model (eval.at_start): {first}")
            metrics.close()
            result.stopped = "out_of_memory"
            raise out_of_memory(spec, run.root, device, state.step, None, peak,
                                when="evaluating the base model before training (eval.at_start)",
                                reserved_gb=peak_reserved_gb(device)) from None

    stop_file = run.root / STOP_FILE
    halted = [False]

    def quality_stop() -> bool:
        """train.stop_when said stop, as every process has agreed (:func:`agree_stop`)."""
        return halted[0]

    def agree_stop() -> None:
        """Rank 0's judge decides; under torchrun the others learn it here (one all-reduce, where a
        checkpoint was just saved), so every process leaves the loop at the same step."""
        mine = result.stop_reason is not None
        if world.active:
            (mine,) = (v > 0 for v in world.all_sum([mine]))
        halted[0] = halted[0] or bool(mine)

    if loaded is not None:
        agree_stop()
    reset_peak_memory(device)  # the peak of training, not of loading the model or caching latents
    oom: str | None = None
    window_rng: dict[str, Any] | None = None
    try:
        with _interrupts_as_ctrl_c() as pending, progress:
            while state.step < total_steps and state.epoch < n_epochs and not quality_stop():
                batches = recipe.epoch_batches(state.epoch)
                while state.batch_in_epoch < len(batches) and state.step < total_steps and not quality_stop():
                    if pending:  # a Ctrl-C whose KeyboardInterrupt was swallowed on its way here
                        raise KeyboardInterrupt
                    if pending.term and not world.active:
                        raise _Preempted
                    window = batches[state.batch_in_epoch : state.batch_in_epoch + train.grad_accum]
                    t0 = time.perf_counter()
                    # a step cut short (SIGTERM between micro-batches, Ctrl-C) is saved with the RNG
                    # states it began with, so the resume draws its dropout masks again, exactly;
                    # under torchrun seed_step reseeds every step instead
                    window_rng = None if world.active else capture_rng()
                    world.seed_step(train.seed, state.step)
                    # one process alone may leave a window half done (its gradients are dropped, the
                    # window is redone on resume); under torchrun all must finish it together
                    abandon = None if world.active else (lambda: pending.term)
                    loss_sum, units, tokens, real = _train_window(recipe, window, precision, scaler, world, ddp,
                                                                  same_passes=getattr(recipe, "sharded", False),
                                                                  abandon=abandon)
                    pending.deferred = True  # from here to the step's count, a Ctrl-C waits
                    if world.active:  # the window's loss over all processes
                        loss_sum, tokens, real = world.all_sum([loss_sum, tokens, real])
                        tokens, real = int(tokens), int(real)
                    norm = _clip(params, train.max_grad_norm, optimizer, scaler)
                    if scaler is not None:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    dt = max(time.perf_counter() - t0, 1e-9)
                    # one read from the device per optimizer step, after the step's kernels are queued
                    loss_total, grad_norm = _read(loss_sum, norm)
                    loss_value = loss_total / units if units else 0.0

                    state.step += 1
                    window_rng = None  # the step is done: the current states are the ones to save
                    state.batch_in_epoch += len(window)
                    state.tokens_seen += tokens
                    result.losses.append(loss_value)
                    record = {
                        "step": state.step,
                        "total_steps": total_steps,  # what `lorapod run` / `logs` show the step against
                        "epoch": state.epoch + state.batch_in_epoch / len(batches),
                        "loss": loss_value,
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": grad_norm,
                        "step_time_s": dt,
                        **memory_stats(device),
                    }
                    if tokens:
                        record["tokens_per_s"] = tokens / dt
                        record["real_tokens_per_s"] = real / dt
                    usd = progress.usd_so_far()
                    if usd is not None:
                        record["usd"] = usd
                    metrics.log(record)
                    progress.update(state.step, loss_value, (real / dt) if tokens else 1 / dt)
                    pending.deferred = False  # the step is whole: counted and logged
                    if pending:
                        raise KeyboardInterrupt
                    if on_step is not None and world.is_main:
                        on_step(state, loss_value)
                    metrics.samples(run.samples, state.step)  # those the step's hook wrote, to the trackers

                    if spec.eval.every_steps and state.step % spec.eval.every_steps == 0:
                        result.last_eval = evaluate()
                    if spec.save.every_steps and state.step % spec.save.every_steps == 0:
                        save()
                    stop = world.is_main and stop_file.exists()
                    term = pending.term
                    quality = result.stop_reason is not None
                    if world.active:  # rank 0's decision, so every process stops at the same step
                        stop, term, quality = (v > 0 for v in world.all_sum([stop, term, quality]))
                    halted[0] = halted[0] or bool(quality)
                    if term:
                        raise _Preempted
                    if stop:
                        event("STOP file found: saving and stopping")
                        save()
                        result.stopped = "stop_file"
                        return result

                if quality_stop():
                    break
                if state.batch_in_epoch >= len(batches):
                    state.epoch += 1
                    state.batch_in_epoch = 0
                    if not spec.eval.every_steps:
                        result.last_eval = evaluate()
                    if spec.save.every_epochs and state.epoch % spec.save.every_epochs == 0:
                        save()
                        agree_stop()
                    on_epoch_end = getattr(recipe, "on_epoch_end", None)  # optional hook (image samples)
                    if on_epoch_end is not None and world.is_main:
                        on_epoch_end(state)
                        metrics.samples(run.samples, state.step)
        if quality_stop():
            result.stopped = "stop_when"
        elif train.max_steps and state.step >= train.max_steps:
            result.stopped = "max_steps"
        if eval_step != state.step:
            result.last_eval = evaluate()
        if world.is_main:
            recipe.save_final(run.adapter)
            run.event(f"finished at step {state.step}; adapter saved to {run.adapter}")
            metrics.close()
            plot_metrics(run.metrics_file, run.root / "loss.png")
        world.barrier()
        return result
    except torch.OutOfMemoryError as exc:
        oom = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
        # the traceback's frames hold the step's activations: let them go before saving
        traceback.clear_frames(exc.__traceback__)
    except (KeyboardInterrupt, _Preempted) as exc:
        how = "SIGTERM" if isinstance(exc, _Preempted) else "Ctrl-C"
        optimizer.zero_grad(set_to_none=True)  # a window left half done: its gradients are not kept
        with _signals_held():
            event(f"interrupted ({how}) at step {state.step}: saving a checkpoint")
            path = save(window_rng, judged=False) if state.step > 0 else None
        result.stopped = "interrupted"
        raise Interrupted(how, state.step, path, run.root) from None
    finally:
        if oom is None:
            metrics.close()
    try:  # out of memory: free what the failed step held, keep what was trained, say what to change
        peak = peak_memory_gb(device)
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        event(f"out of GPU memory in step {state.step + 1}: {oom}")
        path = save(window_rng, judged=False) if state.step > 0 else None  # with the RNG the failed step began with
        result.stopped = "out_of_memory"
        raise out_of_memory(spec, run.root, device, state.step, path, peak,
                            reserved_gb=peak_reserved_gb(device)) from None
    finally:
        metrics.close()


# settings a run can resume under after changing them: the batches, the optimizer state and the
# adapter stay what the checkpoint expects
RESUMABLE = {"train.gradient_checkpointing", "train.blocks_to_swap", "model.dtype", "data.cache_latents",
             "data.cache_text_encoder_outputs"}


def out_of_memory(spec: JobSpec, run_root: Path, device: torch.device, step: int, checkpoint: Path | None,
                  peak_gb: float | None, when: str | None = None,
                  reserved_gb: float | None = None) -> OutOfMemory:
    """What the user reads after an out-of-memory error: the measured peak beside the plan's
    estimate (both as ``max_memory_allocated`` reads them, GiB), what was saved, and the cheapest
    change (``--set``) the planner says fits. The planner's estimate was evidently short for this
    job, so the change must bring its estimate 10% under both the card and its own first estimate."""
    from dataclasses import replace

    from lorapod.catalog.models import find_model
    from lorapod.plan.vram import Settings, arch_of, estimate, make_fit

    card = device_memory_gb(device)
    planned: float | None = None
    change = None
    try:
        model = find_model(spec.model.id, spec.model.family, spec.model.variant)
        # this job ran on lorapod's engine: its own features decide what may be suggested (the planner's
        # default for an image spec is the external trainer its recipe names)
        settings = replace(Settings.from_spec(spec, model), framework="lorapod")
        est = estimate(model, settings)
        planned = est.read_as("allocated")
        arch = None  # the GPU's architecture: fp8 is offered only where it runs
        if device.type == "cuda":
            with contextlib.suppress(RuntimeError, AssertionError):  # a torch without CUDA (tests)
                arch = arch_of(torch.cuda.get_device_capability(device))
        change = make_fit(model, settings, 0.9 * min(card or est.peak_gb, est.peak_gb), arch)
    except LorapodError:  # a model the planner does not know: the generic advice below
        pass
    where = f"this GPU's {card:.1f} GiB were" if card is not None else "the device's memory was"
    measured = f"peak {peak_gb:.2f} GiB allocated" if peak_gb is not None else "peak not measured off CUDA"
    if peak_gb is not None and reserved_gb is not None:
        measured += (f", {reserved_gb:.2f} GiB reserved by the caching allocator "
                     f"({max(0.0, reserved_gb - peak_gb):.2f} GiB of it held but unallocated)")
    plan = f"the plan estimated {planned:.2f} GiB" if planned is not None else "the planner does not know this model"
    saved = (f"checkpoint {checkpoint.name} saved" if checkpoint is not None
             else "nothing trained yet, no checkpoint")
    if change is not None:
        fix = f"cheapest change that fits: {change.describe()}"
        sets = " ".join(f"--set {x}" for x in change.sets)
    else:
        fix = "lower train.micro_batch_size (raise train.grad_accum to keep the batch) or data.sequence_len / " \
              "data.resolution, or turn on train.gradient_checkpointing"
        sets = ("--set train.gradient_checkpointing=true" if not spec.train.gradient_checkpointing
                else "--set train.micro_batch_size=1")
    keys = {x.split("=", 1)[0] for x in sets.replace("--set ", "").split()}
    if checkpoint is None:
        then = f"; start again with {sets}"
    elif keys <= RESUMABLE:
        then = f"; continue with: lorapod train --resume {run_root} {sets}"
    else:  # a new batch shape, optimizer or base would not continue the saved run exactly
        then = f"; start a new run with {sets} ({checkpoint.name} keeps what was trained so far)"
    return OutOfMemory(
        f"out of GPU memory {when or f'in step {step + 1}'}: {where} not enough ({measured}; {plan}); {saved}",
        hint=fix + then, step=step, checkpoint=checkpoint, peak_gb=peak_gb, planned_gb=planned,
    )


class _NoMetrics:
    """What processes other than rank 0 log to."""

    def log(self, record: dict[str, Any]) -> None:
        return None

    def samples(self, folder: Path, step: int) -> None:
        return None

    def close(self) -> None:
        return None


def _train_window(recipe: Recipe, window: Sequence[Any], precision: Precision, scaler,
                  world: distributed.World, ddp=None, same_passes: bool = False,
                  abandon: Callable[[], bool] | None = None) -> tuple[torch.Tensor | float, int, int, int]:
    """Forward/backward over this process's share of one accumulation window.

    ``abandon``, asked between micro-batches: True raises :class:`_Preempted` there (only the
    gradients changed so far, and they are dropped), so a SIGTERM waits at most one micro-batch.

    Returns (summed loss, units of the whole window, tokens, real tokens) of this process's share;
    the loss stays on the device (float64), so no micro-batch waits for the GPU to catch up.
    With N processes the loss is multiplied by N because DDP averages the N gradients.
    ``same_passes`` (FSDP: each forward gathers shards with all processes) pads every process's
    share to the busiest one's with zero-weighted passes.
    """
    units = sum(recipe.batch_units(b) for b in window)
    if units == 0:
        return 0.0, 0, 0, 0
    mine = world.share(window)
    # a process with no micro-batch in a short (end-of-epoch) window still joins the gradient
    # all-reduce, with a zero-weighted pass
    passes = -(-len(window) // world.size) if same_passes else max(len(mine), 1)
    work = mine + [window[0]] * (passes - len(mine))
    total: torch.Tensor | float = 0.0  # on the device: read once per optimizer step, not per micro-batch
    tokens = real = 0
    for i, batch in enumerate(work):
        if i and abandon is not None and abandon():
            raise _Preempted
        last = i == len(work) - 1
        weight = world.size if i < len(mine) else 0
        with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
            with precision.autocast():
                out = ddp(batch) if ddp is not None else recipe.loss(batch)
            scaled = out.loss_sum.float() / units
            if weight != 1:
                scaled = scaled * weight
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        if i < len(mine):
            total = total + out.loss_sum.detach().double()  # float64: what summing Python floats gave
            tokens += out.tokens
            real += out.real_tokens
    return total, units, tokens, real


def _clip(params: list[torch.nn.Parameter], max_norm: float | None, optimizer, scaler) -> torch.Tensor | float:
    """The gradients' norm before clipping, left on the device (read by :func:`_read`)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm is not None else float("inf"))


def _read(loss_sum: torch.Tensor | float, norm: torch.Tensor | float) -> tuple[float, float]:
    """The window's summed loss and the gradient norm as numbers, in one transfer from the device."""
    found = [t for t in (loss_sum, norm) if isinstance(t, torch.Tensor)]
    if not found:
        return float(loss_sum), float(norm)
    device = found[0].device
    both = torch.stack([t.detach().to(device, torch.float64) if isinstance(t, torch.Tensor)
                        else torch.tensor(float(t), dtype=torch.float64, device=device) for t in (loss_sum, norm)])
    loss, grad_norm = both.tolist()
    return loss, grad_norm
