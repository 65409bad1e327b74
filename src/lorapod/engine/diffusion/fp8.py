"""float8 storage for a frozen base: the Linear weights of the transformer blocks kept in float8
(half of bf16) and upcast to the input's dtype per call. One rule for the image families and Wan;
only the blocks' names differ (``transformer_blocks.`` in diffusers' image models, ``blocks.N`` in
Wan's transformer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Float8Linear(torch.nn.Linear):
    """A frozen Linear whose weight is stored in float8 and upcast to the input's dtype per call.

    The upcast makes a new tensor that autograd keeps for the backward pass, so gradients flow
    to the LoRA layers around it (diffusers' layerwise casting casts back in place after the
    forward, which breaks the backward pass; it is made for inference).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return torch.nn.functional.linear(x, self.weight.to(x.dtype), bias)


def _in_transformer_blocks(name: str) -> bool:
    return "transformer_blocks." in name


def store_fp8(denoiser: torch.nn.Module, in_block: Callable[[str], bool] = _in_transformer_blocks) -> int:
    """Store the frozen Linear weights of the transformer blocks in float8 (half of bf16); returns
    how many. Called before LoRA is attached. Embeddings, projections in and out, norms and
    convolutions keep their dtype: they are small, precision-sensitive, and the first of them
    tells diffusers the model's dtype (pipelines allocate latents in it). ``in_block``: whether a
    module's name is inside a block (the image models' rule by default)."""
    n = 0
    for name, mod in denoiser.named_modules():
        if type(mod) is torch.nn.Linear and in_block(name):
            mod.weight.data = mod.weight.data.to(torch.float8_e4m3fn)
            mod.__class__ = Float8Linear
            n += 1
    return n
