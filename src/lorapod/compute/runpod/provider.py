"""RunPod as a :class:`~lorapod.compute.provider.Provider` (REST v1 pods + GraphQL prices).

Pods are created with ``"22/tcp"`` exposed and ``supportPublicIp`` so rsync works, and the job's
public key in ``PUBLIC_KEY``. Over REST, RunPod itself starts no SSH (runpodctl AGENTS.md: "the
rest api rejects ``startSsh``"): the image's start script must append ``$PUBLIC_KEY`` and start
sshd, as RunPod's official images do (runpod/containers ``container-template/start.sh``
``setup_ssh``).

Offers are only GPU types in stock (``lowestPrice.uninterruptablePrice`` is null when nothing is
rentable; runpodctl filters on stock the same way), and a create asks for hosts that can start
the image (``allowedCudaVersions`` from the image's CUDA) with enough RAM and vCPUs per GPU
(``minRAMPerGPU`` from the planner's host-memory need, ``minVCPUPerGPU`` 4 as SkyPilot sends;
the v1 defaults are 8 GB and 2). A create refused for capacity is :class:`NoCapacity`: nothing
was rented, the next offer is tried.

Inside the pod the watchdog destroys it with the pod-scoped ``RUNPOD_API_KEY`` RunPod puts in the
container's environment, through the recipe :meth:`RunPodProvider.self_destroy` builds; the
user's own key never leaves this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lorapod.catalog.images import DEFAULTS, image_cuda
from lorapod.compute.httpapi import ApiError
from lorapod.compute.provider import (
    HOST_OPTIONS,
    Capability,
    Instance,
    InstanceSpec,
    NoCapacity,
    Offer,
    ProviderBase,
    Requirements,
    State,
    Traits,
    without,
)
from lorapod.compute.runpod.api import CUDA_VERSIONS, RunPodApi

if TYPE_CHECKING:
    from lorapod.catalog.gpus import GPU
    from lorapod.catalog.prices import PriceEntry
    from lorapod.compute.runpod.volume_mount import VolumeMount
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

DEFAULT_IMAGE = DEFAULTS["runpod"]
MIN_VCPU_PER_GPU = 4  # SkyPilot's minVcpuCountPerGpu; the v1 default of 2 starves data loading
MIN_RAM_PER_GPU_GB = 16  # never below this, whatever the planner says (v1 default: 8)


def allowed_cuda(image: str) -> list[str] | None:
    """The v1 ``allowedCudaVersions`` a host needs for ``image``: every listed version at or above
    the image's CUDA; None when the image's CUDA is unknown (then any host may be chosen)."""
    need = image_cuda(image)
    if need is None:
        return None
    floor = tuple(int(x) for x in need.split("."))
    return [v for v in CUDA_VERSIONS if tuple(int(x) for x in v.split(".")) >= floor]


class RunPodProvider(ProviderBase):
    """RunPod pods; implements the optional :class:`~lorapod.compute.provider.SupportsVolumes`
    (network volumes) and :class:`~lorapod.compute.provider.SupportsPriceList`."""

    name = "runpod"
    traits = Traits(console_url="https://www.runpod.io/console/pods")
    #: the key ``lorapod plan --live`` reads RunPod's prices with (:meth:`price_list`)
    price_key_env = "RUNPOD_API_KEY"
    #: the network volume this run mounts (set by :meth:`attach_volume` only): limits offers, adds create fields
    volume: VolumeMount | None = None

    def __init__(self, api: RunPodApi | None = None, image: str = DEFAULT_IMAGE,
                 cloud_types: tuple[str, ...] = ("COMMUNITY", "SECURE")) -> None:
        self.api = api or RunPodApi()
        self.image = image
        self.cloud_types = cloud_types

    @classmethod
    def from_kwargs(cls, **kw: Any) -> RunPodProvider:
        return cls(**without(kw, *HOST_OPTIONS))

    @classmethod
    def price_list(cls, api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float) -> list[PriceEntry]:
        """Current per-GPU prices of the types in stock (listed is not rentable: :func:`in_stock`),
        one entry per tier (secure, community, spot)."""
        from lorapod.catalog.prices import PriceEntry
        from lorapod.compute.live_prices import match_gpu, num

        api = RunPodApi(api_key, retries=1, backoff_s=0.2, timeout=timeout_s)
        try:
            types = api.gpu_types()
        finally:
            api.close()
        out = []
        for t in types:
            if not isinstance(t, dict) or not in_stock(t):
                continue
            g = match_gpu(str(t.get("displayName") or t.get("id")), num(t.get("memoryInGb")))
            if g is None:
                continue
            lowest = t.get("lowestPrice") or {}
            tiers = {
                "secure": t.get("securePrice"),
                "community": t.get("communityPrice"),
                "spot": lowest.get("minimumBidPrice") or t.get("communitySpotPrice"),
            }
            for tier, price in tiers.items():
                if usd := num(price):
                    out.append(PriceEntry("runpod", tier, g.name, usd, source="live",
                                          offer_id=str(t.get("id"))))
        return out

    def attach_volume(self, spec: JobSpec, name: str, job: Job | None = None, gpu: str | None = None,
                      max_usd: float | None = None, max_hours: float | None = None,
                      say: Callable[[str], None] = print) -> VolumeMount:
        """Find the network volume ``name`` (or create it where the job's GPU is in stock) and mount
        it in this run's pods: offers are limited to its datacenter from now on."""
        from lorapod.compute.runpod.volume_mount import find_or_create

        self.volume = find_or_create(self, self.api, spec, name, job, gpu, max_usd, max_hours, say)
        return self.volume

    def cache_root(self) -> str | None:
        """The mounted network volume's cache folder, when the run mounts one (volume_mount.py)."""
        return self.volume.cache_root if self.volume is not None else None

    def capabilities(self) -> list[Capability]:
        return [
            Capability("destroy", True, "DELETE /pods/{id}"),
            Capability("stop", False, "a stopped pod still bills its volume; lorapod only destroys"),
            Capability("watchdog_api", True, "pod-scoped RUNPOD_API_KEY inside the pod"),
            Capability("network_volume", True, "network volumes (/networkvolumes) mount in any pod of their datacenter"),
            Capability("spot", False, "interruptible pods are not used: a preempted job would need resume"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        out = []
        image = req.image or self.image
        ram = max(MIN_RAM_PER_GPU_GB, int(-(-req.host_ram_gb // 1)))
        for g in self.api.gpu_types():
            if not in_stock(g):
                continue
            prices = {"SECURE": g.get("securePrice"), "COMMUNITY": g.get("communityPrice")}
            for cloud in self.cloud_types:
                price = prices.get(cloud)
                if not isinstance(price, int | float) or price <= 0:
                    continue
                # RunPod prices one GPU; a pod with gpuCount N bills N times that
                out.append(Offer(self.name, f"{g['id']}|{cloud}", g.get("displayName") or g["id"],
                                 float(price) * req.gpu_count, vram_gb=float(g.get("memoryInGb") or 0),
                                 gpu_count=req.gpu_count, region=cloud.lower(),
                                 extra={"gpu_type_id": g["id"], "cloud_type": cloud, "image": image,
                                        "min_ram_per_gpu_gb": ram},
                                 secure=cloud == "SECURE"))
        return self.volume.limit(out) if self.volume is not None else out

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        gpu_type, _, cloud = offer.id.partition("|")
        image = spec.image or self.image or DEFAULT_IMAGE
        body: dict[str, Any] = {
            "name": spec.provider_label[:190],
            "imageName": image,
            "gpuTypeIds": [gpu_type],
            "gpuCount": max(1, offer.gpu_count),
            "cloudType": cloud or "SECURE",
            "containerDiskInGb": int(spec.disk_gb),
            "volumeInGb": 0,
            "ports": ["22/tcp"],
            "supportPublicIp": True,
            "env": {"PUBLIC_KEY": spec.ssh_public_key},
            "minRAMPerGPU": int(offer.extra.get("min_ram_per_gpu_gb") or MIN_RAM_PER_GPU_GB),
            "minVCPUPerGPU": MIN_VCPU_PER_GPU,
        }
        cuda = allowed_cuda(image)
        if cuda:
            body["allowedCudaVersions"] = cuda
        if self.volume is not None:
            body.update(self.volume.create_fields())
        try:
            pod = self.api.create_pod(body)
        except ApiError as exc:
            if exc.status == 400 and is_no_capacity(exc.message):
                raise NoCapacity(f"RunPod has no {offer.gpu_name} ({cloud.lower()}) for this pod right now",
                                 hint="lorapod tries the next offer") from exc
            raise
        if not pod.get("id"):
            raise NoCapacity(f"RunPod did not return a pod id for {offer.gpu_name}",
                             hint="no capacity for this GPU right now; lorapod tries the next offer")
        return self._instance(pod, offer.usd_per_hour)

    def refresh(self, inst: Instance) -> Instance:
        pod = self.api.get_pod(inst.id)
        if pod is None:
            return inst.with_(state="gone")
        return self._instance(pod, inst.usd_per_hour, inst.created_at)

    def destroy(self, instance_id: str) -> None:
        """Idempotent: RunPod answers 400 ("invalid pod id") for a pod already deleted, so a
        refused DELETE is success when GET confirms the pod is gone."""
        try:
            self.api.delete_pod(instance_id)
        except ApiError as exc:
            if exc.status in (400, 404) and self.api.get_pod(instance_id) is None:
                return
            raise

    def list_instances(self) -> list[Instance]:
        return [self._instance(p, 0.0) for p in self.api.list_pods()]

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {"provider": "runpod", "instance_id": inst.id, "api_url": self.api.base_url,
                "destroy": self.api.self_destroy_recipe(inst.id)}

    def _instance(self, pod: dict[str, Any], usd: float, created_at: float | None = None) -> Instance:
        status = pod.get("desiredStatus")
        port = (pod.get("portMappings") or {}).get("22")
        ip = pod.get("publicIp")
        state: State
        if status == "TERMINATED":
            state = "gone"
        elif status == "EXITED":
            state = "exited"
        elif status == "RUNNING" and ip and port:
            state = "running"
        else:
            state = "booting"
        kw: dict[str, Any] = {}
        if created_at is not None:
            kw["created_at"] = created_at
        return Instance(id=str(pod["id"]), provider=self.name, state=state,
                        usd_per_hour=float(pod.get("costPerHr") or usd or 0.0),
                        ssh_host=ip if state == "running" else None, ssh_port=int(port or 22), ssh_user="root",
                        gpu_name=(pod.get("gpu") or {}).get("displayName"), label=pod.get("name"), **kw)


def in_stock(gpu_type: dict[str, Any]) -> bool:
    """``lowestPrice.uninterruptablePrice`` is null when no on-demand GPU of the type is rentable
    (runpodctl ``internal/api/gpu.go`` reads stock the same way): the list price says nothing."""
    lowest = gpu_type.get("lowestPrice")
    return isinstance(lowest, dict) and lowest.get("uninterruptablePrice") is not None


def is_no_capacity(message: str) -> bool:
    low = message.lower()
    return any(w in low for w in ("no longer any instances available", "no instances available",
                                  "not enough free gpus", "no available"))
