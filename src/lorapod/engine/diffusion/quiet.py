"""Silencing diffusers' and transformers' logs and progress bars, so the engine's own progress is
what a run prints (the image and video recipes, the demos and the image evaluation call it)."""

from __future__ import annotations

import warnings


def quiet() -> None:
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
