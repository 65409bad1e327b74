"""Data-parallel training on torch.distributed: who this process is, and the few collectives
the shared loop needs.

lorapod does not ship a launcher or a communication layer of its own. Processes are started by
``torch.distributed.run`` (torchrun), which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous; gradients are averaged by ``DistributedDataParallel`` (NCCL on GPUs, gloo on CPU).

How the spec's batch maps onto N processes: the *global* batch stays what the spec says,
``micro_batch_size x grad_accum`` samples per optimizer step. Every process builds the same
epoch of micro-batches (they depend only on the seed and the epoch), and of each accumulation
window process ``r`` takes micro-batches ``r, r + N, r + 2N ...``. The loss is normalised by
the units of the whole window and multiplied by N before DDP averages, so the summed gradient is
the single-process gradient, and the data position stays one global (epoch, micro-batch) pair:
a checkpoint taken with N processes resumes exactly with N (or with any other count).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

from lorapod.errors import SpecError

T = TypeVar("T")

#: Rank 0 may evaluate, render samples or write a large checkpoint while the others wait at the
#: next collective; the default 10-minute NCCL timeout would kill a healthy job.
COLLECTIVE_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 when not distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This process's part of ``items``: every N-th, starting at its rank."""
        return list(items[self.rank :: self.size])

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Sum ``values`` over all processes (float64, so counts stay exact)."""
        if not self.active:
            return [float(v) for v in values]
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every process (any picklable object; sent by torch.distributed)."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, device=_comm_device())
        return box[0]

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            if _comm_device().type == "cuda":
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (filling shared caches), the others after it."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def only_main(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` on rank 0, a no-op elsewhere: events, logs and files are written once."""
        return fn if self.is_main else _noop

    def seed_step(self, seed: int, step: int) -> None:
        """With N processes, reseed the global RNGs per (step, rank): dropout masks then differ
        between processes and are reproduced exactly on resume without saving N RNG states."""
        if self.active:
            torch.manual_seed((seed * 1_000_003 + step) * 1024 + self.rank)


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _comm_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def env_world() -> World:
    """What torchrun says this process is (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""
    env = os.environ
    return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


def current() -> World:
    """The world of an initialised process group, or rank 0 of 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return World()


def init(device: str | None = None) -> tuple[World, str | None]:
    """Join the process group torchrun set up (no-op for a single process).

    Returns the world and the device this process trains on: ``cuda:LOCAL_RANK`` on a GPU
    machine (one GPU per process), else the requested device.
    """
    world = env_world()
    if not world.active:
        return world, device
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    if use_cuda:
        if torch.cuda.device_count() <= world.local_rank:
            raise SpecError(f"process {world.local_rank} on this node has no GPU of its own "
                            f"({torch.cuda.device_count()} visible)",
                            hint="start at most one process per GPU (--processes / compute.gpus)")
        torch.cuda.set_device(world.local_rank)
        device = f"cuda:{world.local_rank}"
    if not dist.is_initialized():
        _die_with_launcher()
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return current(), device


def _die_with_launcher(every_s: float = 0.2) -> None:
    """Exit when torchrun goes away. torchrun starts each process in a session of its own, so
    killing the job's process group (the watchdog, ``lorapod down``, a SIGKILLed launcher) would
    otherwise leave the training processes running."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="lorapod-launcher-watch", daemon=True).start()


def leave() -> None:
    """Leave the process group once every process has finished: a barrier, then destroy it.

    A process that exits with its gloo or NCCL group still up can abort in the group's destructor
    ("terminate called without an active exception", SIGABRT), which turns a finished run into
    a failed one. The barrier keeps a fast rank from closing its connections while a slower one is
    still reading the last collective's data.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        current().barrier()
        dist.destroy_process_group()


class _Trainable(torch.nn.Module):
    """The trainable (LoRA) parameters as one module whose forward is the recipe's loss, so DDP
    averages exactly what the optimizer updates, whatever modules the recipe keeps them in."""

    def __init__(self, params: list[torch.nn.Parameter], loss: Callable[[Any], Any]) -> None:
        super().__init__()
        self.params = torch.nn.ParameterList(params)
        self._loss = loss

    def forward(self, batch: Any) -> Any:
        return self._loss(batch)


def data_parallel(params: list[torch.nn.Parameter], loss: Callable[[Any], Any], device: torch.device):
    """``DistributedDataParallel`` over the trainable parameters; calling it computes the loss."""
    import warnings

    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    with warnings.catch_warnings():  # broadcast_buffers is deprecated in name only; there are no buffers here
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(_Trainable(params, loss), device_ids=ids, broadcast_buffers=False)


def check_batch(world: World, grad_accum: int) -> None:
    """Each process needs at least one micro-batch of every full accumulation window."""
    if world.active and grad_accum < world.size:
        raise SpecError(
            f"{world.size} processes share each optimizer step's {grad_accum} micro-batch(es): "
            f"{world.size - grad_accum} would have nothing to do",
            hint=f"set train.grad_accum to {world.size} (or a multiple): the global batch is "
                 "micro_batch_size x grad_accum whatever the process count",
        )


def torchrun_argv(nproc: int, argv: Sequence[str], *, python: str = sys.executable, nnodes: int = 1,
                  node_rank: int | None = None, rdzv_endpoint: str | None = None,
                  rdzv_id: str = "lorapod") -> list[str]:
    """The ``torch.distributed.run`` command that starts ``python -m lorapod ARGV`` N times.

    One node: ``--standalone`` (a private rendezvous on a free local port). Several nodes: a
    c10d rendezvous at ``rdzv_endpoint`` (host:port of node 0) that every node joins.
    """
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint),
                "--rdzv-id", rdzv_id]
        if node_rank is not None:
            cmd += ["--node-rank", str(node_rank)]
    return [*cmd, "-m", "lorapod", *argv]
