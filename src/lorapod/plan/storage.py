"""Which disk to pay for, for a model set reused across sessions (``lorapod plan --storage``).

RunPod offers three kinds. Container disk costs $0.10/GB-month only while the pod runs and is
erased when it stops, so every session re-downloads the models (billed GPU time). A volume disk
costs the same while running and $0.20/GB-month while stopped, tied to one pod. A network
volume costs $0.07/GB-month always and moves between pods. The cheapest depends on how many
hours a month the models sit idle, and on how long a re-download takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapod.catalog.prices import load_storage
from lorapod.errors import PlanError


@dataclass(frozen=True)
class StorageOption:
    kind: str
    usd_per_month: float
    detail: str


@dataclass(frozen=True)
class StorageAdvice:
    model_gb: float
    sessions_per_month: float
    hours_per_session: float
    options: list[StorageOption]
    recommended: str
    reason: str
    snapshot_date: str
    # The guides' headline rates for this size: a month of running / stopped / always.
    container_running_month: float
    volume_stopped_month: float
    network_volume_month: float

    def to_json(self) -> dict:
        return {
            "model_gb": self.model_gb,
            "sessions_per_month": self.sessions_per_month,
            "hours_per_session": self.hours_per_session,
            "options": [o.__dict__ for o in self.options],
            "recommended": self.recommended,
            "reason": self.reason,
            "rates": {
                "container_disk_running_usd_per_month": round(self.container_running_month, 2),
                "volume_disk_stopped_usd_per_month": round(self.volume_stopped_month, 2),
                "network_volume_usd_per_month": round(self.network_volume_month, 2),
            },
            "snapshot_date": self.snapshot_date,
        }


#: What the job's Python environment takes on the instance: the pinned engine without torch, and
#: a CUDA torch with its libraries when the image's is too old (measured: pip wheels, unpacked).
ENV_GB = 3.0
TORCH_GB = 6.0
HEADROOM = 1.15  # logs, pip caches, temporary checkpoint copies while one is written


def advise(model_gb: float, sessions_per_month: float, hours_per_session: float,
           gpu_usd_per_hour: float = 0.74, download_mb_s: float | None = None) -> StorageAdvice:
    """Monthly cost of each kind for N GB used S sessions of H hours, and the cheapest.

    Container disk pays for its re-download each session at ``gpu_usd_per_hour`` (default: an
    RTX 4090 on RunPod's price page) and ``download_mb_s`` (default: the catalog's host speed).
    """
    for name, v in (("--model-gb", model_gb), ("--sessions-per-month", sessions_per_month), ("--hours-per-session", hours_per_session)):
        if v is None or v <= 0:
            raise PlanError(f"{name} must be more than 0 (got {v})")
    snap, st = load_storage()
    hpm = float(st["hours_per_month"])
    running_h = min(sessions_per_month * hours_per_session, hpm)
    idle_h = hpm - running_h
    rp = st["runpod"]
    speed = download_mb_s or float(st["host_download_mb_s"])
    redownload_h = model_gb * 1e3 / speed / 3600
    container = model_gb * rp["container_disk"]["running"] * running_h / hpm
    container_dl = sessions_per_month * redownload_h * gpu_usd_per_hour
    volume = model_gb * (rp["volume_disk"]["running"] * running_h + rp["volume_disk"]["stopped"] * idle_h) / hpm
    network = model_gb * rp["network_volume"]["always"]
    options = [
        StorageOption("container disk", container + container_dl,
                      f"${container:.2f} disk while running + ${container_dl:.2f} of GPU time re-downloading "
                      f"{model_gb:g} GB each session ({redownload_h * 60:.0f} min at {speed:g} MB/s); erased on stop"),
        StorageOption("volume disk", volume,
                      f"${model_gb * rp['volume_disk']['running']:.2f}/month running, "
                      f"${model_gb * rp['volume_disk']['stopped']:.2f}/month stopped; tied to one pod"),
        StorageOption("network volume", network,
                      f"${rp['network_volume']['always']:.2f}/GB-month always; portable between pods"),
    ]
    best = min(options, key=lambda o: o.usd_per_month)
    others = sorted((o for o in options if o is not best), key=lambda o: o.usd_per_month)
    reason = f"{best.kind} costs ${best.usd_per_month:.2f}/month, next is {others[0].kind} at ${others[0].usd_per_month:.2f}"
    per_session = redownload_h * gpu_usd_per_hour + model_gb * rp["container_disk"]["running"] * hours_per_session / hpm
    breakeven = network / per_session
    if best.kind == "container disk":
        reason += (f"; every session also waits {redownload_h * 60:.0f} min for the download, and a network "
                   f"volume becomes cheaper above {breakeven:.0f} sessions a month")
    elif best.kind == "network volume":
        reason += f"; container disk would be cheaper below {breakeven:.0f} sessions a month"
    return StorageAdvice(
        model_gb, sessions_per_month, hours_per_session, options, best.kind, reason, snap.date.isoformat(),
        container_running_month=model_gb * rp["container_disk"]["running"],
        volume_stopped_month=model_gb * rp["volume_disk"]["stopped"],
        network_volume_month=network,
    )
