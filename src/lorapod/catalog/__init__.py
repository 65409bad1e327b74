"""Packaged, dated facts the planner reasons with: GPUs, base models, prices, storage.

Loaders only: every file under ``data/`` carries ``snapshot_date`` and ``source``, and every
answer the planner gives can say how old the facts behind it are. Unknown names raise
:class:`~lorapod.errors.PlanError` with the closest known names.
"""

from lorapod.catalog.gpus import GPU, find_gpu, load_gpus
from lorapod.catalog.models import ImageModel, LLMArch, find_model, llm_from_config
from lorapod.catalog.prices import PriceEntry, load_prices
from lorapod.catalog.snapshot import Snapshot, load_data

__all__ = [
    "GPU",
    "ImageModel",
    "LLMArch",
    "PriceEntry",
    "Snapshot",
    "find_gpu",
    "find_model",
    "llm_from_config",
    "load_data",
    "load_gpus",
    "load_prices",
]
