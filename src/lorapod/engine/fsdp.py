"""FSDP2 for the LLM recipe: the frozen base sharded over the training processes.

With ``train.parallel: fsdp`` (or ``auto`` when the planner says the base does not fit one GPU
but fits in N shards) each transformer block, and the root (embeddings, final norm, LM head),
becomes a ``torch.distributed.fsdp.fully_shard`` unit: a process keeps 1/N of the frozen base
and gathers one block at a time for its forward and backward. Rank 0 loads the base into CPU
memory and each block moves to the GPU as it is sharded, so the whole base is never on one GPU
(the point of sharding it); the other processes build it on ``meta`` without reading a weight
file, and rank 0 broadcasts each tensor into their shards (:func:`load_from_main`), so the job's
host RAM holds one base, not one per process.

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
from lorapod.errors import LorapodError, ModelLoadError, SpecError
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
    buffer outside the units) to ``device``; the shards are already there. ``meta`` tensors (a
    process that did not read the base) are left for :func:`load_from_main`."""
    from torch.distributed.tensor import DTensor

    for t in [*module.parameters(), *module.buffers()]:
        if not isinstance(t, DTensor) and t.device != device and not t.is_meta:
            t.data = t.data.to(device)


def load_from_main(model: torch.nn.Module, root: torch.nn.Module, whole: dict[str, torch.Tensor] | None,
                   device: torch.device, world: World) -> None:
    """Fill every process's shards, LoRA parameters and buffers from rank 0's ``whole`` model.

    Only rank 0 reads the base (into CPU RAM); the others built it on ``meta`` and sharded it
    there, so a node needs host RAM for one base, not one per process (review G14; accelerate's
    ``fsdp_cpu_ram_efficient_loading``). The others allocate their shards on ``device``
    (``to_empty`` through ``root``, the outermost ``fully_shard`` unit, so FSDP2 re-registers
    them), then torch's ``set_model_state_dict(full_state_dict, broadcast_from_rank0)`` sends rank
    0's tensors one at a time and each process keeps its slice. The LoRA parameters travel the
    same way (every process starts from rank 0's seeded adapter). Buffers that no state dict
    holds (rotary ``inv_freq``: ``persistent=False``) are broadcast separately. Tied embeddings
    stay tied: ``from_config`` ties them on ``meta`` and ``fully_shard`` shards one parameter.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not world.is_main:
        root.to_empty(device=device)
        for t in [*model.parameters(), *model.buffers()]:  # anything outside the units
            if t.is_meta:
                t.data = torch.empty_like(t, device=device)
    _check_layout(model, world)
    set_model_state_dict(model, whole if whole is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for _name, buf in _unsaved_buffers(model):
        dist.broadcast(buf, src=0)


def _unsaved_buffers(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers ``state_dict`` leaves out (``persistent=False``), by name."""
    saved = set(model.state_dict().keys())
    return [(name, buf) for name, buf in model.named_buffers() if name not in saved]


def _check_layout(model: torch.nn.Module, world: World) -> None:
    """Refuse, on every process at once, a model whose names, shapes or dtypes differ from rank
    0's: the broadcast would copy (and silently cast) into the wrong tensors."""
    mine = {name: (tuple(t.shape), str(t.dtype)) for name, t in model.state_dict().items()}
    mine.update({name: (tuple(b.shape), str(b.dtype)) for name, b in _unsaved_buffers(model)})
    main = world.broadcast(mine)
    differ = sorted(k for k in main.keys() | mine.keys() if main.get(k) != mine.get(k))
    if world.all_sum([len(differ)])[0]:
        raise ModelLoadError(
            "FSDP2: the model built from config.json on this process differs from rank 0's loaded weights"
            + (f" ({differ[0]}: {mine.get(differ[0])} here, {main.get(differ[0])} on rank 0)" if differ else ""),
            hint="set train.parallel ddp for this model (every process then loads the weights itself)",
        )


def local_share(module: torch.nn.Module) -> tuple[int, int]:
    """(elements this process holds, elements of the whole) over ``module``'s sharded parameters."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    for p in module.parameters():
        if isinstance(p, DTensor):
            held += p.to_local().numel()
            whole += p.numel()
    return held, whole
