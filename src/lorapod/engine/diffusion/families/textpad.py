"""Captions of their own lengths (Qwen3 / Qwen2.5-VL encoders that drop the padding): one batch
padded with zeros to its longest caption, with a mask of the real tokens."""

from __future__ import annotations

import torch


def masked_batch(states: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-caption states (L_i, D) -> ``prompt_embeds`` (B, max L, D) and ``prompt_mask`` (B, max L)."""
    n = max(1, max(int(s.shape[0]) for s in states))
    embeds = torch.zeros(len(states), n, states[0].shape[-1], dtype=states[0].dtype, device=states[0].device)
    mask = torch.zeros(len(states), n, dtype=torch.long, device=states[0].device)
    for i, s in enumerate(states):
        embeds[i, : s.shape[0]] = s
        mask[i, : s.shape[0]] = 1
    return {"prompt_embeds": embeds, "prompt_mask": mask}


def collate_masked(per: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Cached captions (each padded to whatever batch encoded it) -> one batch padded to its longest."""
    return masked_batch([p["prompt_embeds"][: int(p["prompt_mask"].sum())] for p in per])
