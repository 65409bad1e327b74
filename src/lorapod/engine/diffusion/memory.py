"""What lets a large denoiser train on a small card, for every family: fp8 storage, block swap and
the fit check (Wan's memory savers until the video path took a family; N5/N6 of the 2026-12-05 GPU
review brought them to the image engine and one pinned buffer per block).

- ``store_fp8``: the blocks' frozen Linear weights in float8 (Ada/Hopper), upcast per call.
- ``BlockSwap``: the frozen weights of the last N blocks (``Family.blocks``: Wan's ``blocks``, FLUX's
  double + single blocks, Qwen-Image's ``transformer_blocks``, Z-Image's ``layers``) live in CPU
  RAM and visit the GPU only for their own forward and, under its own gradient checkpointing, their
  own backward; on CUDA the next block's copy runs on a side stream while the current one computes.
  Each swapped block's host copy is one flat pinned buffer with a view per weight: torch's host
  allocator rounds every pinned allocation up to a power of two
  (``ATen/core/CachingHostAllocator.h``, ``PowerOf2Ceil``), which pinned Wan2.1-14B's 30 swapped
  blocks as 30.0 GiB instead of 19.6 when each weight was pinned on its own.
- ``host_ram_check``: refuse, before anything is pinned, a swap the host's free RAM cannot hold.
- ``check_fits``: refuse, before anything loads, a job that would not fit the GPU even with the
  most blocks swapped: the planner's memory model (``plan/vram.py``) on the planner's description
  of the model (``memory_model``), with the engine's own settings.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from lorapod.catalog import families
from lorapod.errors import ModelLoadError

if TYPE_CHECKING:
    from lorapod.catalog.models import ImageModel
    from lorapod.plan.vram import Estimate

# ----------------------------------------------------------------------------- memory


def store_fp8(transformer: torch.nn.Module, block_lists: tuple[str, ...] = ("blocks",)) -> int:
    """float8 storage for the frozen Linear weights inside the blocks (``<list>.N.``: the family's
    ``block_lists``; engine/diffusion/fp8.py's rule); upcast per call by ``Float8Linear``."""
    from lorapod.engine.diffusion.fp8 import store_fp8 as store

    prefixes = tuple(f"{attr}." for attr in block_lists)
    return store(transformer, lambda name: name.startswith(prefixes))


#: alignment of each weight's view inside a block's flat host buffer (any dtype's element size divides it)
ALIGN = 64


def flat_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of one flat buffer holding ``tensors``, each at an ``ALIGN``-byte offset."""
    total = 0
    for t in tensors:
        total = -(-total // ALIGN) * ALIGN + t.numel() * t.element_size()
    return total


def pinned_bytes(blocks: list[torch.nn.Module], n: int) -> int:
    """Host bytes block swap pins for the last ``n`` of ``blocks`` (their frozen weights, one flat
    buffer each): what the host-RAM check counts, about 1.0 x the weights' own bytes."""
    chosen = blocks[len(blocks) - n :] if n > 0 else []
    return sum(flat_bytes([p for p in b.parameters() if not p.requires_grad]) for b in chosen)


def host_ram_check(need: int, what: str, available: int | None = None) -> None:
    """HardwareError when ``need`` bytes are more than the host's free RAM (psutil) less 2 GiB of
    headroom for the process itself: a pinned allocation that does not fit takes the host down."""
    from lorapod.errors import HardwareError

    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    headroom = 2 * 1024**3
    if need > available - headroom:
        raise HardwareError(
            f"{what} pins {need / 1024**3:.1f} GiB of host RAM; {available / 1024**3:.1f} GiB is free",
            hint="swap fewer blocks (train.blocks_to_swap), use model.dtype: fp8 (halves the swapped bytes), "
                 "or rent a host with more RAM")


class CudaStreams:
    """The side stream block swap prefetches on, as musubi-tuner's offloader does
    (``modules/custom_offloading_utils.py``: one ``torch.cuda.Stream``, an event per transfer that
    the compute stream waits on). ``record_stream`` tells the caching allocator that the compute
    stream uses a copy made on the side stream, so its memory is not handed out again while the
    block's kernels still read it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def side(self):
        return torch.cuda.stream(self.stream)

    def record(self):
        return self.stream.record_event()

    def use(self, tensors: list[torch.Tensor], event) -> None:
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)
        for t in tensors:
            t.record_stream(compute)


class BlockSwap:
    """Keep the frozen weights of the last ``n`` transformer blocks in CPU RAM (pinned) and bring
    each block's weights to ``device`` just for its own use. The weights are frozen, so the CPU copy
    is made once and "offloading" only drops the GPU copy: nothing is copied back. LoRA weights
    (trainable) never move, so the optimizer and gradients are untouched.

    When: a block is loaded by a forward pre-hook; under ``torch.no_grad`` (samples, evaluation) a
    forward hook drops it again. Training goes through ``checkpoint`` (install it with
    ``transformer.enable_gradient_checkpointing(swap.checkpoint)``): a swapped block runs without
    saving anything, and its backward loads the weights, recomputes the block, runs the block's
    backward and only then drops them. (torch's non-reentrant checkpoint, diffusers' default,
    stops its recomputation at the last saved tensor, before any forward hook could drop the
    weights, so every swapped block stayed on the GPU after backward; and a drop inside the
    recomputation would leave the backward reading host tensors.)

    Prefetch: on CUDA the next block's copy (forward: the following block, backward: the previous
    one) is issued on a side stream while the current block computes, so at most two swapped
    blocks are on the GPU at a time and copies overlap compute. Elsewhere (CPU) the copies are
    plain and nothing is prefetched. ``streams``: the stream object (``CudaStreams``' interface),
    for tests."""

    def __init__(self, blocks: torch.nn.ModuleList, n: int, device: torch.device, streams=None) -> None:
        self.device = torch.device(device)
        every = list(blocks)
        self.blocks = every[len(every) - n :] if n > 0 else []
        self._index = {id(b): i for i, b in enumerate(self.blocks)}
        self.moves = 0
        self.streams = streams if streams is not None else (
            CudaStreams(self.device) if self.device.type == "cuda" and self.blocks else None)
        self._hooks = []
        self._cpu: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
        self._pending: dict[int, tuple[list[torch.Tensor], object]] = {}
        self._loaded: set[int] = set()
        self._replaying = False
        self._removed = False
        self._anchor = torch.zeros((), requires_grad=True)  # makes a swapped block's output need grad
        pin = self.device.type == "cuda"
        self.pinned = 0  # bytes of host buffers made (pinned on CUDA)
        for b in self.blocks:
            frozen = [prm for prm in b.parameters() if not prm.requires_grad]
            flat = torch.empty(flat_bytes(frozen), dtype=torch.uint8, pin_memory=pin)
            self.pinned += flat.numel()
            offset = 0
            for prm in frozen:  # one buffer per block, a view per weight (one pinned allocation, not one per weight)
                offset = -(-offset // ALIGN) * ALIGN
                size = prm.numel() * prm.element_size()
                host = flat[offset : offset + size].view(prm.dtype).view(prm.shape)
                host.copy_(prm.data)
                offset += size
                self._cpu[id(prm)] = (prm, host)
                prm.data = host
            self._hooks.append(b.register_forward_pre_hook(lambda m, args: self._before(m)))
            self._hooks.append(b.register_forward_hook(lambda m, args, out: self._after(m)))
        self._after_backward = False
        if self.blocks and len(every) > n:  # the last resident block's turn: fetch the first swapped one
            self._hooks.append(every[len(every) - n - 1].register_forward_pre_hook(lambda m, args: self._boundary()))

    def _frozen(self, block: torch.nn.Module):
        return [self._cpu[id(p)] for p in block.parameters() if id(p) in self._cpu]

    # -- hooks (every call of a swapped block)
    def _boundary(self) -> None:
        """The block before the first swapped one starts: prefetch that one, except when this is
        the block's recomputation in the backward pass that has just finished with the swapped ones."""
        if self._after_backward:
            self._after_backward = False
            return
        self._prefetch(0)

    def _before(self, block: torch.nn.Module) -> None:
        if self._replaying:  # inside ``_SwappedBlock.backward``: it loads and prefetches itself
            return
        if torch.is_grad_enabled():  # ``_SwappedBlock.forward`` runs without grad; anything else saves nothing
            raise RuntimeError("a swapped block ran with gradients outside BlockSwap's checkpointing, which would "
                               "keep its weights on the GPU: install it with "
                               "transformer.enable_gradient_checkpointing(swap.checkpoint) (memory.swap_blocks does)")
        self._load(block)
        self._prefetch(self._index[id(block)] + 1)

    def _after(self, block: torch.nn.Module) -> None:
        if not torch.is_grad_enabled():
            self._drop(block)

    # -- moves
    def _copy(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def _prefetch(self, i: int) -> None:
        """Issue block ``i``'s copy on the side stream (CUDA only; a no-op when it is there already)."""
        if self.streams is None or not 0 <= i < len(self.blocks) or i in self._loaded or i in self._pending:
            return
        with self.streams.side():
            copies = [self._copy(host) for _, host in self._frozen(self.blocks[i])]
            event = self.streams.record()
        self._pending[i] = (copies, event)

    def _load(self, block: torch.nn.Module) -> None:
        i = self._index[id(block)]
        if i in self._loaded:
            return
        frozen = self._frozen(block)
        pending = self._pending.pop(i, None)
        if pending is not None:
            copies, event = pending
            self.streams.use(copies, event)
        else:
            copies = [self._copy(host) for _, host in frozen]
        for (prm, _), c in zip(frozen, copies, strict=True):
            prm.data = c
        self._loaded.add(i)
        self.moves += 1

    def _drop(self, block: torch.nn.Module) -> None:
        for prm, host in self._frozen(block):
            prm.data = host
        self._loaded.discard(self._index[id(block)])
        self.moves += 1

    # -- training
    def checkpoint(self, block: torch.nn.Module, *args):
        """diffusers' ``gradient_checkpointing_func``: swapped blocks through ``_SwappedBlock``,
        the others through torch's non-reentrant checkpoint (diffusers' own default)."""
        if id(block) not in self._index or self._removed:
            return torch_checkpoint(block.__call__, *args, use_reentrant=False)
        flat, spec = pytree.tree_flatten(args)
        return _SwappedBlock.apply(self, block, spec, self._anchor, *flat)

    def settle(self) -> None:
        """Drop whatever is still loaded or in flight (after sampling: nothing stays on the device)."""
        self._pending.clear()
        for i in list(self._loaded):
            self._drop(self.blocks[i])

    def remove(self) -> None:
        """Every block resident again; ``checkpoint`` becomes torch's plain checkpoint."""
        for h in self._hooks:
            h.remove()
        self._pending.clear()
        for b in self.blocks:
            self._load(b)
        self._removed = True


def place(model: torch.nn.Module, device: torch.device, swap: BlockSwap | None) -> None:
    """Move ``model`` to ``device`` except the swapped blocks' frozen weights (never all at once on the GPU)."""
    skip = {id(p) for b in (swap.blocks if swap else []) for p in b.parameters() if not p.requires_grad}
    for p in model.parameters():
        if id(p) not in skip:
            p.data = p.data.to(device)
    for b in model.buffers():
        b.data = b.data.to(device)


def swap_blocks(transformer: torch.nn.Module, n: int, device: torch.device, streams=None,
                blocks: list[torch.nn.Module] | None = None) -> BlockSwap:
    """Block swap for the last ``n`` of ``blocks`` (the family's ``Family.blocks``; Wan's ``blocks``
    by default), with the gradient checkpointing it needs installed (``BlockSwap.checkpoint``)."""
    swap = BlockSwap(torch.nn.ModuleList(blocks) if blocks is not None else transformer.blocks, n, device, streams)
    transformer.enable_gradient_checkpointing(swap.checkpoint)
    return swap


class _SwappedBlock(torch.autograd.Function):
    """Gradient checkpointing for one swapped block with the load and drop in the right places:
    forward without saving activations (the hooks load and drop), backward = load (prefetch the
    block before it), recompute with the forward's RNG and autocast state, run the block's
    backward, drop. The LoRA gradients accumulate inside, as in torch's reentrant checkpoint."""

    @staticmethod
    def forward(ctx, swap: BlockSwap, block, spec, anchor, *flat):
        ctx.swap, ctx.block, ctx.spec = swap, block, spec
        ctx.is_tensor = [isinstance(x, torch.Tensor) for x in flat]
        ctx.others = [None if t else x for t, x in zip(ctx.is_tensor, flat, strict=True)]
        ctx.save_for_backward(*[x for x in flat if isinstance(x, torch.Tensor)])
        kind = swap.device.type
        ctx.autocast = {"device_type": kind, "enabled": torch.is_autocast_enabled(kind),
                        "dtype": torch.get_autocast_dtype(kind), "cache_enabled": torch.is_autocast_cache_enabled()}
        ctx.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(swap.device) if kind == "cuda" else None)
        out = block(*pytree.tree_unflatten(list(flat), spec))
        if swap._index[id(block)] == len(swap.blocks) - 1:
            swap._prefetch(len(swap.blocks) - 1)  # the backward starts with the last block: fetch it again now
        return out

    @staticmethod
    def backward(ctx, *grads):
        swap, block = ctx.swap, ctx.block
        saved = iter(ctx.saved_tensors)
        flat = [next(saved) if t else x for t, x in zip(ctx.is_tensor, ctx.others, strict=True)]
        inputs = [x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in flat]
        swap._load(block)
        swap._prefetch(swap._index[id(block)] - 1)
        cuda = swap.device.type == "cuda"
        swap._replaying = True
        try:
            with torch.random.fork_rng(devices=[swap.device] if cuda else [], device_type=swap.device.type):
                torch.set_rng_state(ctx.rng[0])
                if cuda:
                    torch.cuda.set_rng_state(ctx.rng[1], swap.device)
                with torch.enable_grad(), torch.autocast(**ctx.autocast):
                    out = block(*pytree.tree_unflatten(inputs, ctx.spec))
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads, strict=False)
                     if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        finally:
            swap._replaying = False
            swap._drop(block)
        swap._after_backward = swap._index[id(block)] == 0
        return (None, None, None, None,
                *[x.grad if isinstance(x, torch.Tensor) and x.requires_grad else None for x in inputs])


def component_config(model_id: str, revision: str | None = None, sub: str = "transformer") -> dict:
    """A component's config.json (transformer, vae: a few hundred bytes), read before any weight is loaded."""
    p = Path(model_id).expanduser()
    if p.is_dir():
        f = p / sub / "config.json"
        if not f.is_file():
            raise ModelLoadError(f"{p} has no {sub}/config.json", hint="point model.id at a diffusers pipeline folder")
        return json.loads(f.read_text(encoding="utf-8"))
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(model_id, f"{sub}/config.json", revision=revision)).read_text())
    except Exception as exc:
        raise ModelLoadError(f"could not read {sub}/config.json of {model_id} ({exc.__class__.__name__}: {exc})",
                             hint="check the id and your network") from exc


def memory_model(spec) -> ImageModel:
    """The planner's description of this job's model (``catalog.models.find_model``: a catalog row
    by name, a local folder sized by its own transformer config), so the engine's fit check and
    ``lorapod plan`` count the same model; a hub id the catalog does not name is sized from its
    transformer config here. ModelLoadError when the config cannot be read."""
    from lorapod.catalog.models import ImageModel, find_model, named_image_model, wan_model_from_config
    from lorapod.errors import PlanError

    cfg = component_config(spec.model.id, spec.model.revision)
    family = spec.model.family if spec.model.family in families.VIDEO else "auto"
    try:
        model = find_model(spec.model.id, family, spec.model.variant)
    except PlanError as exc:
        raise ModelLoadError(exc.message, hint=exc.hint) from exc
    if not isinstance(model, ImageModel) or not model.is_video:
        raise ModelLoadError(f"{spec.model.id} is not a video model the planner knows",
                             hint=f"set model.family to one of {', '.join(families.VIDEO)}")
    if Path(spec.model.id).expanduser().is_dir() or named_image_model(spec.model.id) is not None:
        return model
    spatial = int(component_config(spec.model.id, spec.model.revision, "vae").get("scale_factor_spatial", 8))
    try:
        component_config(spec.model.id, spec.model.revision, "transformer_2")
        experts = 2
    except ModelLoadError:
        experts = 1
    return wan_model_from_config(model, cfg, spatial=spatial, experts=experts)


def check_fits(spec, model: ImageModel, vram_gb: float, *, dtype: str, tokens: int, what: str) -> Estimate:
    """``plan.vram.check_fits`` with this job's settings as the engine runs them: the base in
    ``dtype``, lorapod's own layout, the largest window's ``tokens``; HardwareError if it cannot fit."""
    from lorapod.plan.vram import Settings
    from lorapod.plan.vram import check_fits as fits

    s = replace(Settings.from_spec(spec, model), base_dtype=dtype, framework="lorapod", image_tokens=tokens)
    return fits(model, s, vram_gb, what)
