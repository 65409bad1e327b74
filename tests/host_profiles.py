"""Loopback hosts that look like the images lorapod really rents, each built from documented facts.

The loopback sshd (tests/conftest_ssh.py) is kinder than any rented machine: its sessions have
this machine's PATH (rsync, a python3 with everything), and the fakes used to hand provider
variables to every session. A profile takes that away the way an image does, with the source of
each fact beside it:

* the SSH session's PATH is a folder of links to this machine's commands, minus what the image
  lacks (rsync, Python, package managers), given with sshd's ``SetEnv PATH=...``;
* the image's Python is this machine's test interpreter (it has lorapod's dependencies, as an
  image built for ML has torch), placed where the image keeps it (a conda prefix, or
  ``python`` beside a distribution ``python3`` without torch);
* "PID 1" is a real process started with the container's environment (its ``ENV PATH`` and the
  provider's variables); the session is told where its ``environ`` is with
  ``LORAPOD_PID1_ENVIRON`` (:data:`lorapod.compute.hostfacts.PID1_SEAM`), the one thing a real
  container does not need because its init really is PID 1;
* ``apt-get`` is a stand-in with apt's observable behaviour on these images: their Dockerfiles
  end with ``rm -rf /var/lib/apt/lists/*``, so ``apt-get install`` without ``update`` says
  ``E: Unable to locate package rsync`` (exit 100); with a mirror, ``update`` then ``install``
  puts ``rsync`` on PATH. No real package is installed on this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lorapod.compute.hostfacts import PID1_SEAM

#: sshd's default PATH for root sessions (OpenSSH ``_PATH_STDPATH`` + sbin dirs, Debian build).
SSH_DEFAULT_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: never linked from this machine: each profile decides whether the image has them
IMAGE_DECIDES = ("rsync", "python", "pip", "apt", "apt-get", "yum", "dnf", "conda", "uv", "uvx", "nvidia-smi")

#: ``nvidia-smi`` as NVIDIA's driver ships it, for the three query forms lorapod uses (nvidia-smi(1):
#: ``--query-gpu=name,driver_version,memory.total --format=csv,noheader`` prints one CSV line per GPU,
#: ``-L`` one ``GPU i: NAME (UUID: ...)`` line, the bare command the banner whose first box says
#: ``Driver Version: X`` and ``CUDA Version: Y``, the newest CUDA that driver runs). The NVIDIA
#: container toolkit mounts it into every GPU container (its ``utility`` capability), whatever the image.
NVIDIA_SMI = r"""#!/bin/sh
case "$*" in
  *--query-gpu*) echo "$GPU_NAME, $DRIVER, $GPU_MIB MiB" ;;
  *-L*) echo "GPU 0: $GPU_NAME (UUID: GPU-5e4c2b1a-0000-4000-8000-000000000000)" ;;
  *) printf '%s\n' "+-----------------------------------------------------------------------------------------+" \
       "| NVIDIA-SMI $DRIVER             Driver Version: $DRIVER     CUDA Version: $CUDA     |" \
       "|-----------------------------------------+------------------------+----------------------+" ;;
esac
"""


@dataclass(frozen=True)
class Driver:
    """An NVIDIA driver as a host has it: its version and the newest CUDA it runs (the CUDA Toolkit
    release notes' table "CUDA Toolkit and Corresponding Driver Versions")."""

    version: str
    cuda: str
    gpu: str = "NVIDIA GeForce RTX 4090"
    mib: int = 24564


#: Drivers the providers' hosts run (RunPod's and Vast.ai's offers filter on CUDA 12.4 ... 13.0):
#: 550.x is the CUDA 12.4 branch, 570.x 12.8 (the first with Blackwell), 580.x 13.0.
DRIVERS = {"12.4": Driver("550.144.03", "12.4"), "12.8": Driver("570.133.20", "12.8"),
           "13.0": Driver("580.65.06", "13.0", "NVIDIA H100 80GB HBM3", 81559)}

APT_GET = r"""#!/bin/sh
# Stand-in for apt-get on an image whose Dockerfile ran `rm -rf /var/lib/apt/lists/*`
# (runpod/containers official-templates/pytorch, pytorch/pytorch `official`): no package lists
# until `apt-get update`; with a mirror (MIRROR=1), `install rsync` then puts rsync on PATH.
lists="$(dirname "$0")/.apt-lists"
case "$*" in
  *update*) [ "$MIRROR" = slow ] && exec sleep 600  # a mirror that does not answer
            [ "$MIRROR" = 1 ] || { echo "E: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/jammy/InRelease" >&2; exit 100; }
            touch "$lists"; exit 0 ;;
  *install*rsync*) if [ -f "$lists" ]; then ln -sf "$RSYNC" "$(dirname "$0")/rsync"; exit 0; fi
            echo "E: Unable to locate package rsync" >&2; exit 100 ;;
esac
exit 100
"""


@dataclass(frozen=True)
class Profile:
    """What an image's SSH session sees; ``source`` names where each fact comes from."""

    name: str
    source: str
    rsync: bool = True
    #: where the image's Python (with torch) is: "path" (python3 on the session's PATH), "conda"
    #: (only in <prefix>/bin, on PID 1's PATH alone), "python-not-python3" (``python`` has it,
    #: ``python3`` is the distribution's without torch)
    python: str = "path"
    apt: str | None = None  # None: no apt-get; "mirror": it installs rsync; "offline": it cannot; "slow": hangs
    #: provider variables in PID 1's environment only (never in the SSH session)
    pid1_env: bool = False
    #: the interpreter prints this on stdout before anything else (a wrapper or sitecustomize)
    python_banner: str | None = None
    #: an NVIDIA GPU and its driver (``nvidia-smi`` on PATH); None: a CPU host
    driver: Driver | None = None
    #: the image's Python: "test" (this machine's test interpreter: torch, a CPU build, and everything
    #: lorapod needs), "no-torch" (a fresh virtualenv: an image without torch)
    python_kind: str = "test"


PROFILES = {p.name: p for p in (
    Profile("runpod-pytorch-2.8.0-py3.11",
            "runpod/containers official-templates/pytorch/Dockerfile at 9a7400d (the tag's build): "
            "apt install git wget curl bash libgl1 software-properties-common openssh-server nginx (no rsync); "
            "python3 -> /usr/bin/python3.11; root; rm -rf /var/lib/apt/lists/*",
            rsync=False, apt="mirror"),
    Profile("no-rsync-no-mirror",
            "the same image where apt-get cannot reach a mirror (its lists were removed at build time): "
            "apt-get install says 'Unable to locate package'",
            rsync=False, apt="offline"),
    Profile("no-rsync-slow-mirror",
            "the same image behind a mirror that does not answer: apt-get update hangs",
            rsync=False, apt="slow"),
    Profile("pytorch-pytorch-on-vast",
            "pytorch/pytorch Dockerfile stage official: apt-get install ca-certificates libjpeg-dev libpng-dev "
            "(no rsync), Python in /opt/conda, ENV PATH /opt/conda/bin:$PATH; vast-ai/docs "
            "guides/instances/docker-environment.mdx: image variables are not visible in SSH sessions",
            rsync=False, python="conda", apt="offline", pid1_env=True, python_banner="conda: base environment"),
    # Here `python` is the test interpreter (torch and lorapod's dependencies, as the image's
    # 3.12 has torch) and `python3` this machine's distribution Python, which has no torch: the
    # versions differ from the image's, the fact that matters (which of the two has torch) does not.
    Profile("runpod-base-python-vs-python3",
            "runpod/containers official-templates/base/Dockerfile: rsync installed; "
            "ln -sf /usr/bin/python3.12 /usr/local/bin/python; python3 stays the distribution's",
            python="python-not-python3"),
    # GPU hosts. Their image's torch is this machine's CPU build: it cannot use the GPU, as PyPI's
    # CUDA 13 torch (torch 2.13.0's wheel metadata: nvidia-*-cu13 requirements) cannot on a 12.x
    # driver, and as any CPU build of torch cannot; torch.cuda.is_available() is really False.
    Profile("gpu-cuda-12.4-driver",
            "a RunPod/Vast host on the 550 driver branch (CUDA 12.4; runpod/containers' cu124 images) whose "
            "image torch cannot use the GPU", driver=DRIVERS["12.4"]),
    Profile("gpu-cuda-12.8-driver",
            "runpod/pytorch:1.0.2-cu1281-torch280 (base nvidia/cuda:12.8.1: NVIDIA_REQUIRE_CUDA cuda>=12.8) on a "
            "570 driver, with a torch that cannot use the GPU", driver=DRIVERS["12.8"]),
    Profile("gpu-cuda-13.0-driver",
            "an H100 host on the 580 driver branch (CUDA 13.0), which PyPI's torch >= 2.9 builds need",
            driver=DRIVERS["13.0"]),
    Profile("gpu-image-without-torch",
            "a CUDA base image with Python and no torch (nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04, the base of "
            "runpod/containers' images before their torch layer) on a 570 driver",
            driver=DRIVERS["12.8"], python_kind="no-torch"),
    Profile("provider-vars-in-pid1",
            "runpod-python runpod/cli/utils/ssh_cmd.py reads the pod's variables from /proc/1/environ; "
            "vast-ai/docs docker-environment.mdx: predefined variables are not in SSH sessions",
            pid1_env=True),
)}


@dataclass
class Host:
    """A built profile: the sshd config lines for it, and the "PID 1" process to stop."""

    profile: Profile
    dir: Path
    sshd_config: str
    init: subprocess.Popen | None = None
    session_path: str = ""
    pid1_path: str = ""
    image_python: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        if self.init is not None and self.init.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.init.pid, signal.SIGKILL)
            self.init.wait(5)


def _tool_view(d: Path, keep: tuple[str, ...] = ()) -> Path:
    """A PATH folder: links to this machine's commands, minus what the image decides."""
    d.mkdir(parents=True, exist_ok=True)
    for src in SSH_DEFAULT_PATH:
        if not os.path.isdir(src):
            continue
        for name in sorted(os.listdir(src)):
            if name.startswith(IMAGE_DECIDES) and name not in keep:
                continue
            link = d / name
            if not os.path.lexists(link):
                os.symlink(os.path.join(src, name), link)
    return d


def _python_at(path: Path, banner: str | None, python: str | None = None) -> Path:
    """The image's interpreter at ``path``: this machine's test Python (it has what lorapod needs),
    or ``python``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    say = f"echo {banner!r}\n" if banner else ""
    path.write_text(f"#!/bin/sh\n{say}exec {python or sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


def _python_without_torch(d: Path) -> str:
    """A fresh virtualenv of this machine's base interpreter: Python and pip, no torch."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(d)], check=True, timeout=300,
                   capture_output=True)
    return str(d / "bin" / "python")


def build(profile: Profile, d: Path, env: dict[str, str] | None = None) -> Host:
    """Make the host's folders (and its PID 1 when the profile has one) under ``d``.

    ``env``: the provider's variables (and the fakes' marker); in the SSH session unless the
    profile keeps them in PID 1's environment."""
    env = dict(env or {})
    view = _tool_view(d / "usr-bin", keep=("rsync",) if profile.rsync else ())
    session: dict[str, str] = {}
    pid1_path = [str(view)]
    chosen = _python_without_torch(d / "venv-no-torch") if profile.python_kind == "no-torch" else None
    if profile.driver is not None:
        smi = view / "nvidia-smi"
        smi.write_text(NVIDIA_SMI)
        smi.chmod(0o755)
        drv = profile.driver
        env = {"DRIVER": drv.version, "CUDA": drv.cuda, "GPU_NAME": drv.gpu, "GPU_MIB": str(drv.mib), **env}
    if profile.python == "path":
        image_py = _python_at(view / "python3", profile.python_banner, chosen)
    elif profile.python == "conda":
        image_py = _python_at(d / "opt" / "conda" / "bin" / "python3", profile.python_banner)
        os.symlink(image_py, image_py.parent / "python")
        pid1_path.insert(0, str(image_py.parent))  # ENV PATH /opt/conda/bin:$PATH
    elif profile.python == "python-not-python3":
        image_py = _python_at(view / "python", profile.python_banner)
        distro = shutil.which("python3", path="/usr/bin:/bin")
        assert distro, "the python-vs-python3 profile needs this machine's distribution python3"
        os.symlink(distro, view / "python3")
    else:
        raise ValueError(profile.python)
    if profile.apt:
        apt = view / "apt-get"
        apt.write_text(APT_GET)
        apt.chmod(0o755)
        session["RSYNC"] = shutil.which("rsync") or "/usr/bin/rsync"
        session["MIRROR"] = {"mirror": "1", "slow": "slow"}.get(profile.apt, "0")
    session["PATH"] = str(view)
    init = None
    marker = {k: v for k, v in env.items() if k == "LORAPOD_FAKE_INSTANCE"}
    if profile.pid1_env or profile.python == "conda":
        pid1 = {"PATH": ":".join(pid1_path), **env}
        init = subprocess.Popen(["sleep", "infinity"], env=pid1, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        session[PID1_SEAM] = f"/proc/{init.pid}/environ"
        session.update(marker)  # the fakes find a destroyed instance's processes by it
        if not profile.pid1_env:
            session.update(env)
    else:
        session.update(env)
    line = "SetEnv " + " ".join(f'"{k}={v}"' for k, v in session.items())
    return Host(profile, d, line, init, session_path=str(view), pid1_path=":".join(pid1_path),
                image_python=str(image_py))
