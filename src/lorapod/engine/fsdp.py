"""FSDP2 for the LLM recipe: the frozen base sharded over the training processes.

With ``train.parallel: fsdp`` (or ``auto`` when the planner says the base does not fit one GPU
but fits in N shards) each transformer block, and the root (embeddings, final norm, LM head),
becomes a ``torch.distributed.fsdp.fully_shard`` unit: a process keeps 1/N of the frozen base
and gathers one block at a time for its forward and backward. The base is loaded into CPU
memory first and each block moves to the GPU as it is sharded, so the whole base is never on
one GPU (the point of sharding it).

The LoRA parameters are left out of the shards (``ignored_params``): they are megabytes, so every
process keeps them whole and the same ``DistributedDataParallel`` as without FSDP averages their
gradients. That is why the optimizer, gradient clipping, checkpoints (full LoRA state dicts, the
unchanged on-disk format), exact resume and rank-0-only writes need no FSDP-specific code.

What FSDP does need: every process must run the same number of forward passes (each one gathers
the shards), so the loop pads a process's share of a window with zero-weighted passes
(:func:`lorapod.engine.loop._train_window`) and evaluation pads the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from lorapod.engine.distributed import World
from lorapod.errors import LorapodError, SpecError
from lorapod.spec import JobSpec

GiB = 1024**3


def parallel_mode(spec: JobSpec, world: World, device: torch.device) -> tuple[str, str]:
    """``ddp`` or ``fsdp`` for this job on these processes, and the sentence for the run log."""
    from lorapod.plan.scale import choose_parallel

    requested = spec.train.parallel
    if requested == "fsdp" and spec.method.type == "qlora":
        raise SpecError("train.parallel fsdp does not shard a QLoRA (4-bit) base",
                        hint="use method.type lora with fsdp, or train.parallel ddp for QLoRA")
    if requested == "ddp" or not world.active:
        return "ddp", "DDP (train.parallel ddp): every process holds the whole base"
    try:
        from lorapod.plan.job import build_job
        from lorapod.plan.scale import shardable

        job = build_job(spec)
    except LorapodError as e:
        if requested == "fsdp":
            return "fsdp", f"FSDP2 (train.parallel fsdp): base sharded over {world.size} processes"
        return "ddp", f"DDP (train.parallel auto): no planner estimate for {spec.model.id} ({e.message})"
    vram = torch.cuda.get_device_properties(device).total_memory / GiB if device.type == "cuda" else None
    return choose_parallel(requested, job.estimate, world.size, vram, shardable=shardable(spec, job.model))


def shard(blocks: Iterable[torch.nn.Module], root: torch.nn.Module, trainable: list[torch.nn.Parameter],
          device: torch.device, world: World) -> None:
    """``fully_shard`` each block, then ``root``; the ``trainable`` (LoRA) parameters stay whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world.size,))
    keep = set(trainable)
    for block in blocks:
        fully_shard(block, mesh=mesh, ignored_params=keep & set(block.parameters()))
    fully_shard(root, mesh=mesh, ignored_params=keep & set(root.parameters()))


def move_unsharded(module: torch.nn.Module, device: torch.device) -> None:
    """Move what ``fully_shard`` left where it was loaded (the LoRA parameters it ignores, any
    buffer outside the units) to ``device``; the shards are already there."""
    from torch.distributed.tensor import DTensor

    for t in [*module.parameters(), *module.buffers()]:
        if not isinstance(t, DTensor) and t.device != device:
            t.data = t.data.to(device)


def local_share(module: torch.nn.Module) -> tuple[int, int]:
    """(elements this process holds, elements of the whole) over ``module``'s sharded parameters."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    for p in module.parameters():
        if isinstance(p, DTensor):
            held += p.to_local().numel()
            whole += p.numel()
    return held, whole
