"""The one name a spec's W&B run gets, whichever trainer runs it.

The W&B project, entity and run name are those lorapod's engine uses (the run name defaults to
``output.name``), so runs of one spec land side by side whichever trainer ran them. How each
trainer is told is its own module's business: :func:`lorapod.trainers.sd_scripts.kohya_tracker_args`
(sd-scripts and musubi-tuner), :meth:`lorapod.trainers.axolotl.Axolotl.tracker_fields`, and
ai-toolkit's :attr:`~lorapod.trainers.base.Trainer.forwarded_trackers` (its trainer wrapper sends
the bridged metrics itself; ``trainers/ai_toolkit.py`` says why).
"""

from __future__ import annotations


def run_name(spec) -> str:
    w = spec.tracking.wandb
    return (w.name if w is not None and w.name else None) or spec.output.name or "lora"
