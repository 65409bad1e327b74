"""Whether a RunPod network volume pays for itself for this job, and what using one changes.

A volume bills $0.07/GB-month always (catalog/data/storage.yaml). Without one, every session pays
the plan's "download base model" phase again on the GPU's $/h (the re-download), so the volume wins
above ``volume $/month / re-download $ per session`` sessions a month. The size is what lorapod
would create (:func:`default_size_gb`, or ``compute.volume_gb``).
:func:`lorapod.plan.storage.advise` (``plan --storage``) prices the same question for a model set
you name; this one takes the job's own model, GPU and phases.

Vast.ai has no equivalent lorapod uses: its volumes are disk a host lists on one physical machine,
so a volume only helps while that machine has a free GPU for the job (docs/remote.md, Volumes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

DEFAULT_SESSIONS = 4.0
VAST_NOTE = ("Vast.ai: no volume is used; Vast.ai volumes live on one host's machine (usable only while that "
             "machine has a free GPU), so every Vast.ai session downloads the model again")


@dataclass(frozen=True)
class VolumeAdvice:
    name: str | None  # compute.volume, when the spec names one
    size_gb: int
    usd_per_month: float
    gpu: str
    usd_per_hour: float
    redownload_min: float
    redownload_usd: float  # per session
    sessions_per_month: float
    recommended: bool
    breakeven_sessions: float

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def lines(self) -> list[str]:
        per_month = self.redownload_usd * self.sessions_per_month
        head = (f"network volume {self.size_gb} GB: ${self.usd_per_month:.2f}/month, against re-downloading the base "
                f"model each session ({self.redownload_min:.0f} min on {self.gpu} at ${self.usd_per_hour:.2f}/h = "
                f"${self.redownload_usd:.2f}), ${per_month:.2f}/month at {self.sessions_per_month:g} sessions "
                f"(--sessions-per-month); break-even {self.breakeven_sessions:.0f} sessions")
        if self.name and self.recommended:
            verdict = f"compute.volume {self.name}: worth it"
        elif self.name:
            verdict = (f"compute.volume {self.name}: costs more than the re-downloads at this rate; drop it unless "
                       "the wait matters")
        elif self.recommended:
            verdict = "recommended: add compute.volume: NAME (or --volume NAME)"
        else:
            verdict = "not worth it at this rate: the container disk and a re-download are cheaper"
        out = [f"{head}. {verdict}"]
        if self.name:
            out.append("with compute.volume the RunPod offers are Secure Cloud GPUs in stock in the volume's "
                       "datacenter only (a new volume goes where the #1 GPU is in stock; `lorapod volumes` "
                       "shows it); sessions after the first skip the download")
        return out


def default_size_gb(spec: JobSpec, job: Job | None = None) -> int:
    """What the model, the environment and the caches need, +15%, in tens of GB (at least 20).
    ``job``: the run's planned job when it has one (built once, in ``prepare_run``)."""
    if spec.compute.volume_gb:
        return int(spec.compute.volume_gb)
    from lorapod.errors import PlanError
    from lorapod.plan.job import build_job
    from lorapod.plan.storage import ENV_GB, HEADROOM, TORCH_GB

    if job is None:
        try:
            job = build_job(spec)
        except PlanError:
            return 100
    cache = job.download_gb * 0.1 if spec.is_image else 0.0
    need = (job.download_gb + cache + ENV_GB + TORCH_GB) * HEADROOM
    return max(20, int(math.ceil(need / 10) * 10))


def volume_advice(plan: Any, sessions_per_month: float | None = None) -> VolumeAdvice | None:
    """Price a network volume against the re-downloads of the plan's best RunPod option; None
    when the plan has no RunPod option."""
    from lorapod.catalog.prices import runpod_volume_usd_per_gb_month as usd_per_gb_month

    runpod = [o for o in plan.options if o.provider == "runpod" and o.verdict != "does-not-fit"]
    if not runpod:
        return None
    best = plan.best if plan.best is not None and plan.best.provider == "runpod" else runpod[0]
    download = next((p for p in best.phases if p.name == "download base model"), None)
    if download is None:
        download = next((p for p in best.phases if p.name.startswith("prep")), None)
    spec = plan.job.spec
    size = default_size_gb(spec)
    month = size * usd_per_gb_month()
    hours = download.hours if download is not None else 0.0
    per_session = hours * best.usd_per_hour
    sessions = sessions_per_month if sessions_per_month else DEFAULT_SESSIONS
    breakeven = month / per_session if per_session > 0 else float("inf")
    return VolumeAdvice(spec.compute.volume, size, round(month, 2), best.gpu, best.usd_per_hour, hours * 60,
                        per_session, sessions, per_session * sessions > month, breakeven)


#: RunPod price tiers that are Secure Cloud (the snapshot's price page, the live secure price)
SECURE_TIERS = ("price_page", "secure")


def with_volume(plan: Any) -> Any:
    """The plan as a run with ``compute.volume`` can rent: RunPod Secure Cloud only (network
    volumes are Secure Cloud only, and a volume is RunPod's), with a warning that says so. A plan
    whose spec names no volume is returned as it is."""
    from dataclasses import replace

    if not plan.job.spec.compute.volume:
        return plan
    keep = [o for o in plan.options if o.provider == "runpod" and o.tier in SECURE_TIERS]
    dropped = len(plan.options) - len(keep)
    note = (f"compute.volume {plan.job.spec.compute.volume}: only RunPod Secure Cloud offers are ranked, and at "
            f"`lorapod run` only GPU types in stock in the volume's datacenter ({dropped} other offer(s) left out)")
    return replace(plan, options=keep or plan.options, warnings=[*plan.warnings, note])
