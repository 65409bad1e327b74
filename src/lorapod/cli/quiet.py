"""Library chatter a user cannot act on, kept off the terminal of ``export``, ``eval`` and ``inspect``.

transformers and diffusers print at import and load time: "CLIPImageProcessor requires torchvision
... falling back to CLIPImageProcessorPil" (an image processor lorapod never uses), tqdm bars for
"Loading pipeline components" / "Loading weights" / "Writing model shards", and, when a LoRA has no
text-encoder part, "No LoRA keys associated to CLIPTextModel ... safe to ignore"; peft warns
"Already found a `peft_config` attribute in the model" when eval loads several checkpoints as
adapters of one pipeline, which is the point. What lorapod itself checks and prints (the verified
merge, the files written, the eval page) is what the user needs. ``--debug`` keeps everything.
"""

from __future__ import annotations

import importlib
import os
import warnings


def quiet_libraries() -> None:
    """Errors only, no progress bars, from the libraries that are installed (a library that is not
    installed has nothing to say; the command that needs it reports it missing itself)."""
    if os.environ.get("LORAPOD_DEBUG"):
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("transformers.utils.logging", "diffusers.utils.logging"):
        try:
            lib = importlib.import_module(name)
        except ImportError:
            continue
        lib.set_verbosity_error()
        lib.disable_progress_bar()
    warnings.filterwarnings("ignore", message=r"Already found a `peft_config` attribute")
    warnings.filterwarnings("ignore", category=FutureWarning)
