"""Container images lorapod starts instances from, and the torch each one ships.

The torch version matters before renting: transformers 5 and diffusers 0.42 need torch >= 2.6
(:data:`lorapod.compute.bootstrap.ENGINE_MIN_TORCH`). An image with an older torch still works
(the bootstrap installs a matching torch on the instance), but that adds a ~2.5 GB download to
every cold start, so ``lorapod plan`` says so. An image not listed here is a user's own: its
torch is unknown until the instance boots, and the bootstrap installs only what it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Image:
    name: str
    torch: str
    cuda: str
    python: str


#: Default image per provider: torch and CUDA recent enough for the pinned engine, Python 3.11.
DEFAULTS = {
    "runpod": "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04",
    "vast": "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel",
}

KNOWN = {i.name: i for i in (
    Image("runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04", "2.8.0", "12.8", "3.11"),
    Image("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel", "2.8.0", "12.8", "3.11"),
    Image("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime", "2.8.0", "12.8", "3.11"),
    # The defaults before lorapod 0.1's bootstrap: torch too old for transformers 5.
    Image("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", "2.4.0", "12.4", "3.11"),
    Image("pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel", "2.4.0", "12.4", "3.11"),
)}


def default_image(provider: str) -> str | None:
    return DEFAULTS.get(provider)


def image_note(image: str, floor: str) -> str | None:
    """What ``plan`` says about an image: None when its torch is known to be new enough."""
    from packaging.version import Version

    known = KNOWN.get(image)
    if known is None:
        return (f"image {image} is not in lorapod's catalog: its torch is checked when the instance boots, "
                "and only what it lacks is installed")
    if Version(known.torch) < Version(floor):
        return (f"image {image} ships torch {known.torch}; the engine needs torch >= {floor}, so every cold "
                "start installs one (about 2.5 GB); pick a newer image with --image or compute.image")
    return None
