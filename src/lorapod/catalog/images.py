"""Container images lorapod starts instances from, and what each one really has.

Every fact comes from the image's own build files, named in ``source``: the torch it ships, the
CUDA its base requires (``nvidia/cuda:X.Y.Z`` sets ``NVIDIA_REQUIRE_CUDA cuda>=X.Y``: a host
whose driver is older never starts the container, so offers are filtered by it), where the
interpreter with that torch lives (not always ``python3`` on an SSH session's PATH), and whether
rsync and sshd are in it.

The torch version matters before renting: lorapod's engine needs torch >= 2.7
(:data:`lorapod.compute.bootstrap.ENGINE_MIN_TORCH`). An image with an older torch still works
(the bootstrap installs a matching torch on the instance), but that adds a ~2.5 GB download to
every cold start, so ``lorapod plan`` says so. An image not listed here is a user's own: its
facts are probed when the instance boots, and only what it lacks is installed; its CUDA is read
from its tag when the tag says it (:func:`image_cuda`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Image:
    name: str
    torch: str
    cuda: str  # the CUDA the image's base requires of the host driver
    python: str  # the version of the interpreter that has torch
    #: that interpreter's path; "" when it is whatever ``python3`` the SSH session finds
    python_path: str = ""
    rsync: bool | None = None  # None: not known from the build files
    sshd: bool | None = None
    #: the image's start script installs ``$PUBLIC_KEY`` and starts sshd (RunPod over REST needs it)
    reads_public_key: bool = False
    #: the image's own start command (its CMD), which a spot pod's init runs (compute/remote.py SPOT_INIT)
    start: str = ""
    source: str = ""
    note: str = ""


_RUNPOD_CONTAINERS = "runpod/containers@6990d37"

#: Default image per provider: the provider's own official images, which its hosts keep cached.
DEFAULTS = {
    "runpod": "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2204",
    "vast": "vastai/pytorch:cuda-12.8.1-auto",
}

KNOWN = {i.name: i for i in (
    Image("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2204", "2.8.0", "12.8", "3.12",
          python_path="/usr/local/bin/python", rsync=True, sshd=True, reads_public_key=True, start="/start.sh",
          source=f"{_RUNPOD_CONTAINERS} official-templates/pytorch/README.md (the tag), docker-bake.hcl "
                 "(torch 2.8.0 from whl/cu128), official-templates/base/Dockerfile (apt: openssh-server rsync; "
                 "ln -sf /usr/bin/python3.12 /usr/local/bin/python; torch installed with `python -m pip`), "
                 "base/docker-bake.hcl (BASE_IMAGE nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04), "
                 "container-template/start.sh setup_ssh (appends $PUBLIC_KEY, starts sshd)",
          note="`python3` is Ubuntu 22.04's 3.10 without torch; `python` (3.12) has it"),
    Image("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404", "2.8.0", "12.8", "3.12",
          python_path="/usr/local/bin/python", rsync=True, sshd=True, reads_public_key=True, start="/start.sh",
          source=f"{_RUNPOD_CONTAINERS} official-templates/pytorch/README.md, base/Dockerfile, start.sh"),
    Image("vastai/pytorch:cuda-12.8.1-auto", "2.11.0", "12.8", "3.12", python_path="/venv/main/bin/python",
          rsync=True, sshd=None,
          source="vast-ai/base-image@a7552d1 derivatives/pytorch/README.md (torch in /venv/main), "
                 "configs/pytorch.json + promote-pytorch.yml AUTO_TAG_MAP (cuda-12.8.1-auto -> the newest "
                 "cu128 torch, 2.11.0 there; default python 312), Dockerfile (apt: rsync; conda env /venv/main)",
          note="a moving tag; /venv/main is activated only by ~/.bashrc on interactive logins, so a command "
               "over SSH must name /venv/main/bin/python; SSH itself is set up by Vast.ai's ssh launch mode"),
    # The defaults before lorapod 0.2: no rsync in either, and their Python is off the SSH PATH on Vast.
    Image("runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04", "2.8.0.dev", "12.8", "3.11",
          rsync=False, sshd=True, reads_public_key=True,
          source=f"{_RUNPOD_CONTAINERS} history c43dc90..9a7400d official-templates/pytorch/Dockerfile (apt: git "
                 "wget curl bash libgl1 software-properties-common openssh-server nginx; TORCH --pre from "
                 "whl/nightly/cu128); the bake target was dropped in 8a61ee0",
          note="a retired tag; its torch is a 2.8.0 nightly"),
    Image("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel", "2.8.0", "12.8", "3.11", python_path="/opt/conda/bin/python",
          rsync=False, sshd=False,
          source="pytorch/pytorch Dockerfile, stage `official` (apt: ca-certificates libjpeg-dev libpng-dev; "
                 "ENV PATH /opt/conda/bin:$PATH)",
          note="Python only under /opt/conda/bin, on PATH through the image's ENV, which Vast.ai does not pass "
               "to SSH sessions (vast-ai/docs guides/instances/docker-environment.mdx)"),
    Image("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime", "2.8.0", "12.8", "3.11", python_path="/opt/conda/bin/python",
          rsync=False, sshd=False, source="pytorch/pytorch Dockerfile, stage `official`"),
    # The defaults before lorapod 0.1's bootstrap: torch too old for transformers 5.
    Image("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", "2.4.0", "12.4", "3.11", rsync=False,
          reads_public_key=True, source=f"{_RUNPOD_CONTAINERS} history"),
    Image("pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel", "2.4.0", "12.4", "3.11", python_path="/opt/conda/bin/python",
          rsync=False, source="pytorch/pytorch Dockerfile"),
)}


def default_image(provider: str) -> str | None:
    return DEFAULTS.get(provider)


def image_cuda(image: str) -> str | None:
    """The CUDA version (``"12.8"``) a host's driver must support to start ``image``: from the
    catalog, else from the tag where it says (``cuda12.8``, ``cuda-12.8.1``, ``cu1281``); None
    when nobody can tell (then no host filter is sent)."""
    known = KNOWN.get(image)
    if known is not None:
        return known.cuda
    m = (re.search(r"cuda-?(\d+)\.(\d+)", image) or re.search(r"[-:]cu(\d\d)(\d)\d?(?=-|$)", image))
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


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
