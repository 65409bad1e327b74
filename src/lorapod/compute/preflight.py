"""Checks that run on this machine before anything is rented: a mistake found here costs nothing.

Each refusal is a :class:`PreflightError` saying what to fix. In order: the data paths exist;
``lorapod data check`` finds no errors in them (``--force`` goes on anyway); the model is a local
folder, a built-in, a catalog entry or a repository the Hugging Face Hub knows; a gated model has
``HF_TOKEN``; the disk asked for (``compute.disk_gb``, rented machines only) holds the model, the
caches, the checkpoints and the job's environment (sizes from the planner).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.errors import LorapodError

if TYPE_CHECKING:
    from lorapod.compute.provider import Provider
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec
from lorapod.plan.storage import ENV_GB, HEADROOM, TORCH_GB


class PreflightError(LorapodError):
    """Refused before renting: nothing was created, nothing was billed."""


@dataclass
class Preflight:
    notes: list[str] = field(default_factory=list)  # things worth saying that do not stop the run
    disk_needed_gb: float | None = None


def preflight(spec: JobSpec, provider: Provider, job: Job | None = None, force: bool = False,
               env: dict[str, str] | None = None, deps: str = "auto", trainer: str | None = None) -> Preflight:
    """Run every check for ``spec`` about to run on ``provider``; raise on the first refusal.
    What applies is decided by the provider's declared traits, never its name, and the disk it
    boots is its own default image's. ``job`` is the run's planned job (None: the planner cannot
    estimate it, so the disk is not checked)."""
    traits = provider.traits
    env = dict(os.environ if env is None else env)
    out = Preflight()
    if deps == "auto" and not traits.runs_here:  # the lock the instance's env is built from is read here
        from lorapod.compute.bootstrap import derive_lock, extra_for

        lock = derive_lock(extra_for(spec))
        if lock.missing:
            why = ""
            if any(m.startswith("bitsandbytes") for m in lock.missing):
                why = (f" ({'QLoRA' if spec.method.type == 'qlora' else 'train.optimizer adamw_8bit'} needs "
                       "bitsandbytes on the instance, at the version this machine pins; its wheel installs on a "
                       "CPU machine too)")
            raise PreflightError(f"this machine lacks {', '.join(lock.missing[:4])}, so the versions to install "
                                 f"on the instance are unknown{why}",
                                 hint=f"pip install 'lorapod[{lock.extra}]' here first, so both ends run the same "
                                      "versions (or --deps none with an image that has everything)")
    if not traits.runs_here:
        _check_attention(spec, spec.compute.image or provider.image)
    if trainer is None:
        _check_block_swap(spec, job)
    paths = [Path(p) for p in spec.data_paths()]
    if spec.data.val_path:
        paths.append(Path(spec.data.val_path))
    for p in paths:
        if not p.exists():
            raise PreflightError(f"data path {p} does not exist", hint="fix data.path (or data.val_path) in the spec; "
                                 "nothing was rented")
    _check_data(spec, paths, force, out)
    gated = _check_model(spec, env, out)
    if gated and not env.get("HF_TOKEN"):
        raise PreflightError(f"{spec.model.id} is gated on Hugging Face and HF_TOKEN is not set",
                             hint="accept the model's license on its Hub page, then export HF_TOKEN=hf_... "
                                  "(it travels to the instance over SSH, never on a command line)")
    if not traits.borrowed:  # on a borrowed host the disk is the host's, not asked for
        image = spec.compute.image or provider.image
        if note := _image_note(image):
            out.notes.append(f"{provider.name}: {note}")
        _check_disk(spec, job, image, out)
    return out


def _check_block_swap(spec: JobSpec, job: Job | None) -> None:
    """``train.blocks_to_swap`` on a model whose blocks lorapod's engine does not swap would be
    ignored, and the job would run out of memory the way it was meant not to (review N5): the
    engine's own declaration (:data:`lorapod.plan.frameworks.LORAPOD_BLOCK_SWAP`) decides."""
    from lorapod.plan.frameworks import framework
    from lorapod.plan.vram import model_kind

    if not spec.is_image or not spec.train.blocks_to_swap or job is None:
        return
    kind = model_kind(job.model)
    family = getattr(job.model, "family", None)
    if framework("lorapod").swaps_blocks(kind, family):
        return
    raise PreflightError(
        f"train.blocks_to_swap: {spec.model.id} ({family or kind}) has no transformer blocks for lorapod's engine to "
        "swap (a U-Net), so the setting would be refused on the instance after the model download",
        hint="set train.blocks_to_swap: 0 (lorapod plan says what fits instead), or train with --trainer "
             "sd-scripts or musubi-tuner, which swap its blocks")


def _check_attention(spec: JobSpec, image: str | None) -> None:
    """``train.attention: flash`` needs the flash_attn package on the instance. PyPI has no wheel of
    it (only sources, a build of an hour or more) and no catalogued image ships it, so on those
    images the job would fail after the model download: refused here. A user's own image (not in
    the catalog) may have it: the engine's own check decides there."""
    from lorapod.catalog.images import KNOWN

    if spec.is_image or spec.train.attention != "flash" or (image and image not in KNOWN):
        return
    raise PreflightError(
        f"train.attention flash needs the flash_attn package, which the image {image or '(the default)'} does not "
        "ship and the instance cannot install (PyPI has no flash-attn wheel)",
        hint="leave train.attention at auto: on CUDA it runs torch's own FlashAttention varlen kernel "
             "(where its torch has one), or use an image of your own that has flash_attn (--image)")


def _image_note(image: str | None) -> str | None:
    from lorapod.catalog.images import image_note
    from lorapod.compute.bootstrap import ENGINE_MIN_TORCH

    return image_note(image, ENGINE_MIN_TORCH) if image else None


def image_notes(spec: JobSpec, providers: list[str]) -> list[str]:
    """What the catalog says about the image each provider would boot (``plan`` prints these too)."""
    from lorapod.catalog.images import default_image, image_note
    from lorapod.compute.bootstrap import ENGINE_MIN_TORCH

    notes = []
    for p in dict.fromkeys(providers):
        image = spec.compute.image or default_image(p)
        note = image_note(image, ENGINE_MIN_TORCH) if image else None
        if note:
            notes.append(f"{p}: {note}")
    return notes


def _check_data(spec: JobSpec, paths: list[Path], force: bool, out: Preflight) -> None:
    from lorapod.data.check import check_path, spec_check_args

    val = Path(spec.data.val_path) if spec.data.val_path else None
    kwargs = spec_check_args(spec)  # the family, trigger, sequence length ... the spec gives its data
    for p in paths:
        if val is not None and p == val:
            continue
        report = check_path(p, **kwargs)
        if not report.has_errors:
            continue
        errors = [f for f in report.findings if f.severity == "error"]
        msg = f"`lorapod data check {p}` finds {len(errors)} error(s), first: {errors[0].message}"
        if not force:
            raise PreflightError(msg, hint=f"fix the data (lorapod data check {p}), or pass --force to rent anyway")
        out.notes.append(msg + " (--force: going on)")


def _check_model(spec: JobSpec, env: dict[str, str], out: Preflight) -> bool:
    """True when the model is gated. A model that exists nowhere is refused."""
    from lorapod.catalog.models import find_model, is_builtin
    from lorapod.errors import PlanError

    model_id = spec.model.id
    if is_builtin(model_id) or Path(model_id).exists():
        return False
    try:
        found = find_model(model_id, spec.model.family, getattr(spec.model, "variant", None))
    except PlanError:
        found = None
    if found is not None:  # a catalog entry: its gating is recorded there
        return bool(found.license.gated)
    hub = _hub_lookup(model_id, env)
    if hub is None:  # offline or unreachable
        out.notes.append(f"could not check {model_id} on the Hugging Face Hub; the instance will try to download it")
        return False
    status, info = hub
    if status in (401, 404):
        raise PreflightError(f"model {model_id} was not found on the Hugging Face Hub",
                             hint="check model.id (owner/name, as on the model's page); a private model needs HF_TOKEN")
    if status == 403:
        raise PreflightError(f"HF_TOKEN has no access to {model_id}",
                             hint="accept the model's license on its Hub page with the account that owns HF_TOKEN")
    return bool(info.get("gated")) if isinstance(info, dict) else False


def _hub_lookup(model_id: str, env: dict[str, str]) -> tuple[int, Any] | None:
    """``GET {HF_ENDPOINT}/api/models/{id}``: (status, json) or None when the Hub is not asked."""
    if env.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return None
    import httpx

    base = env.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    headers = {"Authorization": f"Bearer {env['HF_TOKEN']}"} if env.get("HF_TOKEN") else {}
    try:
        r = httpx.get(f"{base}/api/models/{model_id}", headers=headers, timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code >= 500:
        return None
    try:
        body = r.json()
    except ValueError:
        body = None
    return r.status_code, body


def _check_disk(spec: JobSpec, job: Job | None, image_name: str | None, out: Preflight) -> None:
    from lorapod.catalog.images import KNOWN
    from lorapod.compute.bootstrap import ENGINE_MIN_TORCH

    if job is None:
        out.notes.append("the planner does not know this model, so the disk size was not checked")
        return
    image = KNOWN.get(image_name or "")
    from packaging.version import Version

    torch_gb = 0.0 if image is not None and Version(image.torch) >= Version(ENGINE_MIN_TORCH) else TORCH_GB
    cache_gb = job.download_gb * 0.1 if spec.is_image else 0.0  # latents and text-encoder outputs
    need = (job.download_gb + job.upload_gb + cache_gb + job.pull_gb + ENV_GB + torch_gb) * HEADROOM
    out.disk_needed_gb = need
    if need > spec.compute.disk_gb:
        raise PreflightError(
            f"compute.disk_gb = {spec.compute.disk_gb:g} is too small: about {need:.0f} GB are needed (model "
            f"{job.download_gb:.1f} GB, data {job.upload_gb:.2f} GB, caches {cache_gb:.1f} GB, checkpoints "
            f"{job.pull_gb:.2f} GB, environment {ENV_GB + torch_gb:.0f} GB, +15%)",
            hint=f"--set compute.disk_gb={math.ceil(need / 10) * 10}")
