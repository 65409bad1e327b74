"""What the built-in captioners share: the interface they implement and where their model files come from.

It sits below both the registry (``data/captions/__init__.py``, which imports each built-in to
register it) and the built-ins, so a captioner never imports the registry that imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from lorapod.errors import ModelLoadError, require


class Captioner(Protocol):
    """Turns a batch of RGB PIL images into one draft caption each."""

    def caption(self, images: list) -> list[str]: ...


def resolve_model_dir(model: str, files: list[str]) -> Path:
    """A local folder as given, or a hub repo fetched into the local Hugging Face cache.

    Only the files a backend needs are fetched; HF_HUB_OFFLINE=1 makes it use the cache only.
    """
    local = Path(model).expanduser()
    if local.is_dir():
        return local
    if local.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelLoadError(f"{model} is neither a local model folder nor a hub id (org/name).",
                             hint="Give a folder holding the model files, or a Hugging Face id like org/name.")
    hub = require("huggingface_hub", "caption", "Fetching a captioner model from the Hugging Face hub")
    try:
        return Path(hub.snapshot_download(model, allow_patterns=files))
    except Exception as exc:  # network, auth, missing repo: all end the same way for the user
        raise ModelLoadError(f"cannot fetch {model} from the hub: {exc}",
                             hint="Check the id and your connection, or download it and pass the folder.") from exc
