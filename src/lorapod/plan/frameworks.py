"""How each trainer builds the tensors the memory model counts: logits, loss and checkpoints.

The same job needs very different memory in different trainers, mostly because of two things:
how the (tokens x vocabulary) logits are built for the loss, and where gradient checkpoints
live. Each profile below says it as the trainer's code does it (bytes per logit element alive at
the worst moment of the loss's forward and backward), so the memory model can count it instead
of guessing. The eager ones (hf, transformers-4.46, qwen-remote-code, lorapod) are counted by
running that code on torch's meta device (plan/counted_llm.py: loss_bytes_per_logit;
tests/test_plan_step_count.py holds them equal); the chunked and fused ones are read from their code.
Speed differences between trainers are not written here: they are fitted (plan/fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapod.catalog.families import engine_supports


@dataclass(frozen=True)
class Framework:
    name: str
    # Bytes per (token x vocabulary) element alive at the loss's peak.
    logit_bytes: float
    # Gradient checkpoints (each layer's input) are kept in CPU RAM, not on the GPU.
    offloads_checkpoints: bool = False
    why: str = ""
    # Block swap: whether the next block's weights are copied to the GPU while the current block
    # computes (a side stream), so a step takes max(compute, transfers), not their sum; and how many
    # swapped blocks are on the GPU at once beyond the resident ones (kohya's offloader, in
    # sd-scripts and musubi-tuner, swaps a leaving block's weights into the arriving one's
    # buffers: none; lorapod's engine holds the computing block and the arriving one: two).
    prefetches_blocks: bool = True
    swap_in_flight: int = 0
    # Which models' ``train.blocks_to_swap`` the trainer implements ("image", "video"): the planner
    # and the OOM hint suggest block swap only there (review N5), and preflight refuses it elsewhere.
    # lorapod's engine declares its own (lorapod.engine: video.py swaps Wan blocks); a trainer not
    # listed with a kind ignores or refuses the setting for it.
    block_swap: frozenset[str] = frozenset()
    # lorapod's own engine answers per family, not per kind (catalog/families.py ``engine_supports``:
    # its DiT families swap blocks, the U-Nets have none to swap)
    swaps_per_family: bool = False
    # fp8 base weights (``model.dtype: fp8``; an Ada/Hopper/Blackwell GPU is needed all the same)
    fp8_base: bool = True

    def swaps_blocks(self, kind: str, family: str | None = None) -> bool:
        """Whether ``train.blocks_to_swap`` does something in this trainer for a model of ``kind``
        ("image" / "video") and, where the trainer decides per family, of ``family``."""
        if self.swaps_per_family:
            return family is not None and engine_supports(family, "block_swap")
        return kind in self.block_swap


#: The model kinds lorapod's own engine swaps blocks for (engine/diffusion/memory.py ``swap_blocks``,
#: used by the image and the video recipe); which families within them is the catalog's
#: ``engine_supports(family, "block_swap")`` (every DiT family; the U-Nets have no blocks).
LORAPOD_BLOCK_SWAP: frozenset[str] = frozenset({"image", "video"})

FRAMEWORKS: dict[str, Framework] = {
    "hf": Framework(
        "hf", 12.0,
        why="transformers < 4.46 (LlamaForCausalLM): logits upcast to fp32 in the model and a shifted contiguous "
        "copy (4 + 4), log-softmax saved for the backward (4); the backward's peak is that and two gradients",
    ),
    "transformers-4.46": Framework(
        "transformers-4.46", 12.0,
        why="transformers >= 4.46 (ForCausalLMLoss): bf16 logits (2), their fp32 upcast (4), log-softmax (4); labels are "
        "shifted instead of the logits; the backward's peak (log-softmax, its gradient, the logits' gradient) is higher",
    ),
    "lorapod": Framework(
        "lorapod", 12.0,
        why="lorapod's engine: bf16 logits (2) at label positions only, their fp32 upcast (4), log-softmax (4); the "
        "backward's peak is log-softmax and two float32 gradients. Block swap (engine/diffusion/memory.py): the next "
        "block is prefetched on a CUDA side stream, two swapped blocks on the GPU at a time",
        prefetches_blocks=True, swap_in_flight=2, block_swap=LORAPOD_BLOCK_SWAP, swaps_per_family=True,
    ),
    "qwen-remote-code": Framework(
        "qwen-remote-code", 12.0,
        why="Qwen (v1) remote code under the Trainer's bf16 autocast: bf16 logits and a shifted copy (2 + 2), the "
        "cross-entropy's log-softmax in float32 (4); the backward's peak is that and two float32 gradients",
    ),
    "torchtune": Framework(
        "torchtune", 3.0,
        why="CEWithChunkedOutputLoss: bf16 logits kept as 8 chunks (2), one chunk upcast to fp32 at a time",
    ),
    "litgpt": Framework(
        "litgpt", 3.0, why="chunked LM head (128 tokens): bf16 logit chunks (2), fp32 per chunk",
    ),
    "unsloth": Framework(
        "unsloth", 0.0, offloads_checkpoints=True,
        why="fused / cut cross-entropy never holds the full logits; 'unsloth' checkpointing offloads layer inputs",
    ),
}
# Image trainers: the loss is on latents, so no logits; the entries exist so their speed can be fitted.
# Block swap: sd-scripts' flux_train_network.py / sd3_train_network.py (--blocks_to_swap; its SDXL
# script has none, trainers/sd_scripts.py refuses it there), musubi-tuner's Wan, HunyuanVideo and
# FLUX.1 Kontext / Qwen-Image networks (--blocks_to_swap), diffusion-pipe's blocks_to_swap; ai-toolkit,
# SimpleTuner and the diffusers scripts have no such option.
_SWAPS = {"sd-scripts": frozenset({"image"}), "musubi-tuner": frozenset({"image", "video"}),
          "diffusion-pipe": frozenset({"image", "video"})}
for _name in ("sd-scripts", "musubi-tuner", "simpletuner", "ai-toolkit", "diffusers", "diffusion-pipe"):
    FRAMEWORKS[_name] = Framework(_name, 0.0, block_swap=_SWAPS.get(_name, frozenset()))


def framework(name: str) -> Framework:
    return FRAMEWORKS.get(name, FRAMEWORKS["hf"])
