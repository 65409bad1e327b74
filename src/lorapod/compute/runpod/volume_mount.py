"""A run's RunPod network volume: found by name or created where the GPU is, then attached and mounted.

``compute.volume: NAME`` (or ``lorapod run --volume NAME``) keeps what every session would
otherwise fetch again on a volume that outlives the pod: the Hugging Face cache (``HF_HOME``: the
base model), the job's Python environment (``.envs/<lock digest>``) and the engine's latent and
text-encoder caches (``LORAPOD_CACHE_DIR``), all under ``<mount>/lorapod/``. The job's work folder
(data, run folder, logs) stays on the container disk: it is scratch, pulled and gone with the pod.

A volume lives in one datacenter and a pod that mounts it must run there (REST v1
``PodCreateInput.networkVolumeId`` + ``dataCenterIds``; ``tests/contracts/runpod-rest-v1.openapi.json``),
and network volumes are a Secure Cloud feature (docs.runpod.io/pods/storage/create-network-volumes:
"Network volumes are only available for Pods in the Secure Cloud"). So once a volume is chosen the
offers are only Secure Cloud GPU types in stock in its datacenter, asked per datacenter with the
GraphQL ``gpuTypes { lowestPrice(input: {gpuCount, dataCenterId}) { stockStatus } }`` query public
RunPod clients use for per-datacenter stock (the REST document has no stock endpoint). A new volume
goes to the datacenter where the planner's best Secure Cloud GPU is in stock, preferring the one with
the most of the ranked GPU types in stock (more fallbacks when the first is taken).

The volume is created once, never retried blindly (:meth:`NetworkVolumes.create`); lorapod never
deletes it: it bills $0.07/GB-month until ``lorapod volumes --delete ID``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lorapod.compute.provider import Offer
from lorapod.compute.runpod.volumes import NetworkVolumes, Volume
from lorapod.errors import LorapodError, ProviderError
from lorapod.plan.volume import default_size_gb

if TYPE_CHECKING:
    from lorapod.compute.provider import Provider
    from lorapod.compute.runpod.api import RunPodApi
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

#: PodCreateInput.dataCenterIds' enum in RunPod's OpenAPI document (every datacenter a pod may ask for)
DATACENTERS = ("EU-RO-1", "CA-MTL-1", "EU-SE-1", "US-IL-1", "EUR-IS-1", "EU-CZ-1", "US-TX-3", "EUR-IS-2",
               "US-KS-2", "US-GA-2", "US-WA-1", "US-TX-1", "CA-MTL-3", "EU-NL-1", "US-TX-4", "US-CA-2", "US-NC-1",
               "OC-AU-1", "US-DE-1", "EUR-IS-3", "CA-MTL-2", "AP-JP-1", "EUR-NO-1", "EU-FR-1", "US-KS-3", "US-GA-1")
#: PodCreateInput.volumeMountPath's default, where RunPod's images expect the volume
MOUNT = "/workspace"
CACHE_DIR = "lorapod"
_DC = re.compile(r"^[A-Z]{2,4}-[A-Z]{2,4}-\d{1,2}$")


def mount_path() -> str:
    """Where the pod mounts the volume: ``LORAPOD_RUNPOD_VOLUME_MOUNT`` (an absolute path, for an
    image that expects another one) or RunPod's ``/workspace``."""
    path = os.environ.get("LORAPOD_RUNPOD_VOLUME_MOUNT") or MOUNT
    if not path.startswith("/") or ".." in path.split("/"):
        raise LorapodError(f"LORAPOD_RUNPOD_VOLUME_MOUNT={path!r}", hint="an absolute path such as /workspace")
    return path.rstrip("/") or MOUNT


def cache_env(cache_root: str) -> dict[str, str]:
    """The variables that put the job's caches on the volume (the engine's DiskCache reads
    LORAPOD_CACHE_DIR, huggingface_hub reads HF_HOME)."""
    return {"HF_HOME": f"{cache_root}/huggingface", "LORAPOD_CACHE_DIR": f"{cache_root}/cache"}


def stock_query(datacenters: tuple[str, ...] | list[str], gpu_count: int) -> str:
    """One GraphQL request, one alias per datacenter (``dc0``, ``dc1``...)."""
    parts = [f'dc{i}: gpuTypes {{ id lowestPrice(input: {{gpuCount: {int(gpu_count)}, dataCenterId: "{dc}"}}) '
             "{ stockStatus uninterruptablePrice } }" for i, dc in enumerate(datacenters)]
    return "query GpuStockByDataCenter { " + " ".join(parts) + " }"


def stock_by_datacenter(api: Any, datacenters: tuple[str, ...] | list[str], gpu_count: int = 1) -> dict[str, set[str]]:
    """GPU type ids in stock (a ``stockStatus``) per datacenter; bounded: unknown shapes are skipped."""
    dcs = [dc for dc in datacenters if _DC.match(dc)]
    if not dcs:
        return {}
    resp = api.request("POST", api.graphql_url, json_body={"query": stock_query(dcs, gpu_count)})
    body = resp.json()
    if not isinstance(body, dict) or body.get("errors"):
        raise api.error(resp, "POST", "graphql gpuTypes by datacenter")
    data = body.get("data") or {}
    out: dict[str, set[str]] = {}
    for i, dc in enumerate(dcs):
        rows = data.get(f"dc{i}") or []
        out[dc] = {str(g["id"])[:128] for g in rows[:500] if isinstance(g, dict) and isinstance(g.get("id"), str)
                   and isinstance(g.get("lowestPrice"), dict) and g["lowestPrice"].get("stockStatus")}
    return out


@dataclass(frozen=True)
class VolumeMount:
    """The volume a run uses, where it is mounted, and what its datacenter has in stock."""

    volume: Volume
    mount: str
    stock: frozenset[str]
    created: bool = False

    @property
    def datacenter(self) -> str:
        return self.volume.datacenter

    @property
    def cache_root(self) -> str:
        return f"{self.mount}/{CACHE_DIR}"

    def limit(self, offers: list[Offer]) -> list[Offer]:
        """Only Secure Cloud offers of GPU types in stock in the volume's datacenter."""
        return [o for o in offers if o.extra.get("cloud_type") == "SECURE" and o.extra.get("gpu_type_id") in self.stock]

    def create_fields(self) -> dict[str, Any]:
        """What ``POST /pods`` adds to attach the volume (PodCreateInput)."""
        return {"networkVolumeId": self.volume.id, "dataCenterIds": [self.datacenter],
                "volumeMountPath": self.mount, "cloudType": "SECURE"}

    def describe(self) -> str:
        return (f"network volume {self.volume.name} ({self.volume.id}, {self.volume.size_gb} GB, "
                f"${self.volume.usd_per_month:.2f}/month) in {self.datacenter}, mounted at {self.mount}; "
                f"offers limited to Secure Cloud GPUs in stock there")


def pick_datacenter(ranked_gpu_types: list[str], stock: dict[str, set[str]]) -> tuple[str, str] | None:
    """(datacenter, GPU type) for the best-ranked type in stock anywhere; among datacenters that
    have it, the one with most of the ranked types in stock; ties in RunPod's own order."""
    for gpu in ranked_gpu_types:
        where = [dc for dc in stock if gpu in stock[dc]]
        if where:
            best = max(where, key=lambda dc: (len(set(ranked_gpu_types) & stock[dc]), -list(stock).index(dc)))
            return best, gpu
    return None


def find_or_create(provider: Provider, api: RunPodApi, spec: JobSpec, name: str, job: Job | None = None,
                   gpu: str | None = None, max_usd: float | None = None, max_hours: float | None = None,
                   say: Callable[[str], None] = print) -> VolumeMount:
    """The volume called ``name`` with what its datacenter has in stock, or a new one created where
    the planner's best Secure Cloud GPU among ``provider``'s offers is (RunPodProvider.attach_volume
    mounts it)."""
    from lorapod.compute.offers import choose_offers

    vols = NetworkVolumes(api)
    found = vols.find(name)
    gpu_count = max(1, int(spec.compute.gpus))
    if len(found) > 1:
        raise LorapodError(f"{len(found)} RunPod network volumes are named {name!r}: "
                           + ", ".join(f"{v.id} ({v.datacenter})" for v in found),
                           hint="delete the extra ones with `lorapod volumes --delete ID`, or pick another name")
    if found:
        vol = found[0]
        here = stock_by_datacenter(api, [vol.datacenter], gpu_count).get(vol.datacenter, set())
        if not here:
            raise ProviderError(f"no GPU is in stock in {vol.datacenter}, where network volume {name} is",
                                hint="try again later; a pod with this volume can only run there")
        mount = VolumeMount(vol, mount_path(), frozenset(here))
        say(f"using {mount.describe()}")
        return mount
    ranked = [r for r in choose_offers(spec, provider, gpu, max_usd, max_hours, job=job)
              if r.offer.extra.get("cloud_type") == "SECURE"]
    if not ranked:
        raise ProviderError("no Secure Cloud offer fits this job, and network volumes are Secure Cloud only",
                            hint="drop compute.volume, or pick another --gpu")
    types = list(dict.fromkeys(str(r.offer.extra["gpu_type_id"]) for r in ranked))
    stock = stock_by_datacenter(api, DATACENTERS, gpu_count)
    choice = pick_datacenter(types, stock)
    if choice is None:
        raise ProviderError(f"no RunPod datacenter has {', '.join(r.offer.gpu_name for r in ranked[:3])} in stock now",
                            hint="try again later or another --gpu; no volume was created")
    dc, _gpu = choice
    size = default_size_gb(spec, job)
    vol = vols.create(name, size, dc)
    mount = VolumeMount(vol, mount_path(), frozenset(stock[dc]), created=True)
    say(f"created {mount.describe()}; it bills until `lorapod volumes --delete {vol.id}`")
    return mount
