"""Optimizers and LR schedules from the spec.

AdamW is fused on CUDA (one kernel for all parameters); ``adamw_8bit`` uses bitsandbytes and
therefore needs CUDA. Schedules come from transformers so they match what users know from
Trainer/axolotl.
"""

from __future__ import annotations

import math

import torch

from lorapod.errors import HardwareError, require
from lorapod.spec import TrainSpec


def build_optimizer(params: list[torch.nn.Parameter], train: TrainSpec, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if train.optimizer == "adamw_8bit":
        if device.type != "cuda":
            raise HardwareError(
                "adamw_8bit (bitsandbytes) runs on CUDA GPUs only",
                hint="set train.optimizer: adamw on this machine; keep adamw_8bit for the GPU run",
            )
        bnb = require("bitsandbytes", "cuda", "8-bit AdamW")
        return bnb.optim.AdamW8bit(groups, lr=train.learning_rate, betas=(0.9, 0.999))
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=train.learning_rate, betas=(0.9, 0.999), fused=fused)


def warmup_steps(train: TrainSpec, total_steps: int) -> int:
    if train.warmup_steps:
        return min(train.warmup_steps, total_steps)
    return math.ceil(train.warmup_ratio * total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec, total_steps: int):
    from transformers import get_scheduler

    return get_scheduler(
        train.scheduler,
        optimizer=optimizer,
        num_warmup_steps=warmup_steps(train, total_steps),
        num_training_steps=total_steps,
    )
