"""lorapod: plan, check, train and run LoRA fine-tunes on rented GPUs.

``import lorapod`` stays cheap: torch, transformers and diffusers are imported only by the
modules that need them, so the planner and the data checks work on a bare install.
"""

__version__ = "0.1.0"
