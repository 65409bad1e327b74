"""What a job needs installed on the instance, and getting it there from a stock image.

The lock is read from THIS machine's installed distributions (``importlib.metadata``): the
closure of ``lorapod[<extra>]`` with every distribution pinned at the version the controller
runs, so both ends agree. torch is left out of the pins on purpose: GPU images ship a CUDA
build, and replacing it with the controller's (often CPU) build would be wrong and slow. It is a
floor instead (:data:`ENGINE_MIN_TORCH`); a torch is installed on the instance only when the
image's is missing or older.

The instance side is :mod:`lorapod.compute.envsetup` (standard library only). Environments are
cached by the lock's digest under ``<work root>/.envs/`` (a dot folder: never mistaken for a
job's work folder), so a second job on the same instance, or on a persistent volume pointed to
by ``LORAPOD_REMOTE_ROOT``, installs nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from packaging.requirements import Requirement
from packaging.version import Version

from lorapod.errors import LorapodError, RemoteError

if TYPE_CHECKING:
    from lorapod.compute.provider import Provider
    from lorapod.spec import JobSpec

AUTO_PYTHON = "auto"  # find the instance's interpreter the way the image has it (compute/hostfacts.py)


@dataclass(frozen=True)
class Bootstrap:
    """How lorapod and what it needs get onto the instance, so both ends run the same versions.

    ``strategy`` is how lorapod itself travels: ``source`` rsyncs this very package into ``pkg/``;
    ``wheel`` builds a wheel of this source tree (cached by content) and ``pip install --no-deps
    --target pkg/``. ``python`` is the instance's interpreter the job's environment is built from;
    ``auto`` finds it the way the image has it (:mod:`lorapod.compute.hostfacts`).
    ``deps``: ``auto`` gives the job its dependencies when ``python`` lacks them (a virtualenv with
    the image's torch, cached by lock; see :mod:`lorapod.compute.bootstrap`), ``none`` runs the job
    with ``python`` as it is. ``extra`` is the install extra of the job's engine (``llm``, ``image``).
    """

    strategy: Literal["source", "wheel"] = "source"
    python: str = AUTO_PYTHON
    deps: Literal["auto", "none"] = "auto"
    extra: str = "llm"
    #: the interpreter the image's build files put torch in (catalog/images.py), tried first by ``auto``
    image_python: str = ""
    #: the newest CUDA the instance's NVIDIA driver runs ("12.8"; None: no GPU seen, or not probed):
    #: a torch installed there is the build for it (:func:`torch_build_for`)
    driver_cuda: str | None = None

#: The oldest torch the engine runs on, and CI tests it (tools/torch_versions.sh). 2.7 because it is
#: the oldest torch in an image lorapod's users start from (Vast.ai's PyTorch template
#: ``2.7.0-cuda-12.8.1``; RunPod's default image has 2.8), and the first release with CUDA 12.8 builds
#: (Blackwell: RTX 5090, B200). transformers 5 and diffusers 0.42 would take 2.6; an image with 2.6
#: gets a torch for its driver installed instead (docs/performance.md, "torch versions").
ENGINE_MIN_TORCH = "2.7"
#: Where torch's CUDA builds are published, one index per build (``<base>/cu128``);
#: ``LORAPOD_TORCH_INDEX`` names a mirror of it.
TORCH_INDEX = "https://download.pytorch.org/whl"
#: The CUDA builds of each torch release (torch's RELEASE.md "Release Compatibility Matrix" and
#: pytorch.org/get-started/previous-versions): 2.7 dropped 12.4 and added 12.8, 2.8 added 12.9,
#: 2.9 replaced 12.9 with 13.0; later releases keep 12.6, 12.8 and 13.0 (:data:`LATER_BUILDS`).
TORCH_CUDA_BUILDS: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 6): ("11.8", "12.4", "12.6"), (2, 7): ("11.8", "12.6", "12.8"), (2, 8): ("12.6", "12.8", "12.9"),
    (2, 9): ("12.6", "12.8", "13.0"),
}
LATER_BUILDS = ("12.6", "12.8", "13.0")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def torch_build_for(torch_version: str, driver_cuda: str) -> str | None:
    """The CUDA build of ``torch_version`` a driver that runs CUDA ``driver_cuda`` can load
    (``"cu128"``), or None when it has none. The newest build not newer than the driver; failing
    that, the oldest build of the driver's CUDA major version, which NVIDIA's minor version
    compatibility lets a 12.x driver (>= 525) run (CUDA Compatibility guide; the start probe's
    matmul confirms it on the instance). A CUDA 13 build never runs on a 12.x driver."""
    builds = TORCH_CUDA_BUILDS.get(_v(torch_version)[:2], LATER_BUILDS)  # type: ignore[arg-type]
    have = _v(driver_cuda)
    fits = [b for b in builds if _v(b) <= have]
    same_major = [b for b in builds if _v(b)[0] == have[0]]
    chosen = fits[-1] if fits else (same_major[0] if same_major else None)
    return "cu" + chosen.replace(".", "") if chosen else None
#: Never pinned from the controller: the instance's image decides its CUDA build.
TORCH_FAMILY = re.compile(r"^(torch|triton|nvidia-.*|pytorch-triton.*)$")
ENVS_DIR = ".envs"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_for(spec: JobSpec) -> str:
    """The install extras a job's engine needs: ``image`` for diffusion families, else ``llm``;
    ``,cuda`` (bitsandbytes) for QLoRA's 4-bit base or the 8-bit AdamW optimizer, which load it
    (engine/llm_model.py, engine/optim.py; review N2: without it a QLoRA job failed at model load
    on the instance, an ``adamw_8bit`` image job after the download and the latent cache);
    ``,track`` (the W&B client) when the spec logs to W&B."""
    extras = ["image" if spec.is_image else "llm"]
    if needs_bitsandbytes(spec):
        extras.append("cuda")
    if spec.tracking.wandb is not None:
        extras.append("track")
    return ",".join(extras)


def needs_bitsandbytes(spec: JobSpec) -> bool:
    """Whether the job imports bitsandbytes: QLoRA (the 4-bit base) or ``train.optimizer: adamw_8bit``."""
    return spec.method.type == "qlora" or spec.train.optimizer == "adamw_8bit"


@dataclass(frozen=True)
class Lock:
    """Exact pins (``name==version``) of everything the job imports, torch aside."""

    extra: str
    pins: tuple[str, ...]
    torch_floor: str = ENGINE_MIN_TORCH
    torch_pin: str | None = None  # what to install when the image's torch is too old
    missing: tuple[str, ...] = field(default=())  # required, but not installed on this machine

    @property
    def digest(self) -> str:
        blob = json.dumps([self.extra, self.pins, self.torch_floor, self.torch_pin]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def derive_lock(extra: str, dist: str = "lorapod") -> Lock:
    """The closure of ``dist[extra]`` as installed here, markers evaluated for this machine."""
    try:
        root = md.distribution(dist)
    except md.PackageNotFoundError as exc:
        raise LorapodError(f"{dist} is not installed as a package here, so its dependencies cannot be read",
                           hint="pip install -e . (or pip install lorapod) on this machine") from exc
    pins: dict[str, str] = {}
    floors = [Version(ENGINE_MIN_TORCH)]
    missing: list[str] = []
    seen: set[tuple[str, str]] = set()

    def walk(requires: list[str] | None, extras: set[str]) -> None:
        for line in requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in (extras or {""})]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in envs):
                continue
            name = canonical(req.name)
            if name == canonical(dist):  # lorapod[image] requires lorapod[llm]: follow its extras
                walk(root.requires, set(req.extras))
                continue
            if TORCH_FAMILY.match(name):
                if name == "torch":
                    floors.extend(Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~="))
                continue
            key = (name, ",".join(sorted(req.extras)))
            if key in seen:
                continue
            seen.add(key)
            try:
                d = md.distribution(req.name)
            except md.PackageNotFoundError:
                missing.append(str(req))
                continue
            pins[name] = f"{name}=={d.version}"
            walk(d.requires, set(req.extras))

    walk(root.requires, set(extra.split(",")))
    torch_pin = None
    try:
        local = Version(md.version("torch"))
        torch_pin = f"torch=={local.base_version}"  # the controller's version, the instance's build
    except md.PackageNotFoundError:
        pass
    return Lock(extra, tuple(sorted(pins.values())), str(max(floors)), torch_pin, tuple(missing))


@dataclass
class EnvResult:
    """What envsetup reported: the job's interpreter and how it came to be."""

    python: str
    how: str  # image | reused | built | as-is
    installed: int
    seconds: float
    torch: str | None = None
    installer: str | None = None
    env: str | None = None
    #: why the image's torch was not kept (it cannot use this GPU), when that was the case
    torch_note: str | None = None

    def describe(self) -> str:
        return {
            "image": "the image has everything; installed nothing",
            "reused": f"reused the environment {self.env}; installed nothing",
            "built": f"installed {self.installed} packages with {self.installer} into {self.env}",
            "as-is": f"{self.python} as it is; installed nothing",
        }[self.how] + (f" ({self.seconds:.1f} s, torch {self.torch or 'none'})" if self.how != "as-is" else "")


def envsetup_source() -> bytes:
    from lorapod.compute import envsetup

    return Path(envsetup.__file__).read_bytes()


def env_request(lock: Lock, python: str, root: str, driver_cuda: str | None = None) -> dict[str, Any]:
    """What envsetup gets. On an instance with an NVIDIA GPU (``driver_cuda``: the newest CUDA its
    driver runs), the image's torch is kept only when it really uses the GPU (envsetup runs a matmul
    there), and a torch it installs is the controller's version built for that driver, from torch's
    own index (review N4: PyPI's Linux torch 2.13 is a CUDA 13 build, which a 12.x driver cannot load,
    so the job trained on the CPU of a rented GPU)."""
    import os

    if lock.missing:
        raise LorapodError(
            f"this machine lacks {', '.join(lock.missing[:4])}, so the versions to install on the instance "
            "are unknown", hint=f"pip install 'lorapod[{lock.extra}]' here first, so both ends run the same versions")
    request: dict[str, Any] = {"python": python, "pins": list(lock.pins), "torch_floor": lock.torch_floor,
                               "torch_pin": lock.torch_pin, "digest": lock.digest, "envs": f"{root}/{ENVS_DIR}"}
    if driver_cuda:
        version = (lock.torch_pin or f"torch=={lock.torch_floor}.0").split("==", 1)[1]
        build = torch_build_for(version, driver_cuda)
        if build is None:
            raise RemoteError(f"the instance's NVIDIA driver runs CUDA up to {driver_cuda}, and torch {version} "
                              "has no build for it", hint="pick another offer (a newer driver), or an image "
                                                          "whose torch matches its driver (--image)")
        base = (os.environ.get("LORAPOD_TORCH_INDEX") or TORCH_INDEX).rstrip("/")
        request.update({"cuda_driver": driver_cuda, "torch_pin": f"torch=={version}+{build}",
                        "torch_index": f"{base}/{build}", "digest": f"{lock.digest}-{build}"})
    return request


def parse_result(stdout: str, stderr: str, python: str) -> EnvResult:
    """envsetup's last JSON line -> EnvResult, or one clear error saying what to do."""
    lines = [x for x in stdout.strip().splitlines() if x.startswith("{")]
    if not lines:
        raise RemoteError(f"{python} could not run lorapod's environment set-up on the instance: "
                          f"{(stderr or stdout).strip()[-400:]}",
                          hint="the instance needs Python >= 3.11 (pass --python PATH to pick another interpreter)")
    out = json.loads(lines[-1])
    if not out.get("ok") and out.get("kind") == "python":
        raise RemoteError(out["error"], hint="pass --python PATH to a Python >= 3.11 on the instance, "
                                             "or use an image that has one (--image)")
    if not out.get("ok"):
        pkg = out.get("package")
        raise RemoteError(
            f"{out['error']}\n{out.get('output', '').strip()[-600:]}",
            hint=(f"the instance could not download {pkg or 'the packages'} from {out.get('index') or 'its index'}: "
                  "it needs access to a package index (check PIP_INDEX_URL / pip.conf or UV_INDEX_URL on the "
                  "instance), or an image that already has lorapod's dependencies (--image)"))
    return EnvResult(python=out["python"], how=out["how"], installed=int(out.get("installed", 0)),
                     seconds=float(out.get("seconds", 0.0)), torch=out.get("torch"),
                     installer=out.get("installer"), env=out.get("env"),
                     torch_note=str(out["torch_note"])[:600] if out.get("torch_note") else None)


def bootstrap_for(boot: Bootstrap, provider: Provider, spec: JobSpec) -> Bootstrap:
    """The bootstrap for this job on this provider: the engine's extra from the spec; the local
    provider runs the job with this very interpreter (``sys.executable``) and installs nothing."""
    import sys
    from dataclasses import replace

    boot = replace(boot, extra=extra_for(spec))
    if provider.traits.runs_here:
        boot = replace(boot, python=sys.executable, deps="none")
    elif boot.python == AUTO_PYTHON:
        # a catalogued image's own interpreter (with its torch) is tried first by the search
        # (runpod/pytorch 1.0.x: `python3` is Ubuntu's 3.10 without torch); an explicit --python wins
        from lorapod.catalog.images import KNOWN

        image = KNOWN.get(spec.compute.image or provider.image or "")
        if image is not None and image.python_path:
            boot = replace(boot, image_python=image.python_path)
    return boot
