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

Spot (``Requirements.interruptible``): the offers are the GPU types with a spot price in each cloud
(``secureSpotPrice`` / ``communitySpotPrice``, the type having a ``lowestPrice.minimumBidPrice``),
each bid at that price if it is within ``max_bid_per_gpu_hour``, and created through GraphQL
``podRentInterruptable`` with ``bidPerGpu`` (:data:`~lorapod.compute.runpod.api.RENT_INTERRUPTABLE`).
A spot pod bills its bid per GPU (dstack issue 1890: a spot pod billed the bid, not the listed
price). RunPod preempts one by stopping it (``desiredStatus: EXITED``; runpod/docs pods/pricing.mdx:
SIGTERM, SIGKILL 5 s later, the volume disk kept): :meth:`RunPodProvider.refresh` reports it
``exited`` with ``interruptible`` set, so a controller can tell it from a lost connection. That
SIGTERM goes to PID 1 alone, and the official images' PID 1 (``start.sh``) neither handles nor
passes it on: a spot pod of an image whose start command the catalog knows is rented with
lorapod's init as its ``dockerArgs`` (:data:`lorapod.compute.remote.SPOT_INIT`), which runs that
start command and passes SIGTERM on to the job so it saves (``doctor runpod --spot`` checks it).

Inside the pod the watchdog destroys it with the pod-scoped ``RUNPOD_API_KEY`` RunPod puts in the
container's environment, through the recipe :meth:`RunPodProvider.self_destroy` builds; the
user's own key never leaves this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lorapod.catalog.billing import Billing
from lorapod.catalog.images import DEFAULTS, KNOWN, image_cuda
from lorapod.catalog.prices import load_storage
from lorapod.compute.httpapi import ApiError
from lorapod.compute.provider import (
    HOST_OPTIONS,
    Capability,
    DoctorFacts,
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
from lorapod.compute.remote import spot_init_args
from lorapod.compute.runpod.api import CUDA_VERSIONS, RunPodApi

if TYPE_CHECKING:
    from lorapod.catalog.gpus import GPU
    from lorapod.catalog.prices import PriceEntry
    from lorapod.compute.deadman import DeadMan
    from lorapod.compute.runpod.volume_mount import VolumeMount
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

DEFAULT_IMAGE = DEFAULTS["runpod"]
_STORAGE = load_storage()[1]["runpod"]  # the dated storage snapshot's row (catalog/data/storage.yaml)
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
    #: The container disk bills while the pod runs and nothing once it is stopped (erased then; the
    #: storage snapshot's runpod row, runpod/docs pods/pricing.mdx). Spot: a preemption is "a
    #: 5-second warning (SIGTERM signal, followed by SIGKILL)" (pods/pricing.mdx; its 2022 blog says
    #: "without notice": then nothing is saved on the signal and the newest checkpoint home resumes),
    #: and the pod is stopped, not paused: lorapod destroys it once noticed.
    billing = Billing(disk_running_gb_month=float(_STORAGE["container_disk"]["running"]),
                      disk_stopped_gb_month=float(_STORAGE["container_disk"]["stopped"]),
                      sigterm_grace_s=5.0, preempted="stops", source="runpod/docs pods/pricing.mdx")
    #: the pod's own variables (runpod docs, environment variables) and what `--spot` checks
    doctor = DoctorFacts(scoped=("RUNPOD_POD_ID", "RUNPOD_API_KEY"), spot_checks=("bid", "sigterm path"))
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
                                          offer_id=str(t.get("id")),
                                          interruptible=tier == "spot"))  # priced as spot quotes (plan/spot.py)
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
            Capability("spot", True, "spot pods rented with bidPerGpu (podRentInterruptable); a preempted pod is "
                                     "stopped: lorapod destroys it and resumes on the next offer (compute/recovery.py)"),
            Capability("spot_resume", False, "a stopped spot pod restarted may get zero GPUs (RunPod's zero-gpus "
                                             "page): lorapod never waits for it"),
            Capability("deadman", True, "the container's command (REST dockerStartCmd, GraphQL dockerArgs) starts the "
                                        "switch before the image's own start script, for images whose start script "
                                        "the catalog knows (catalog/images.py); the pod-scoped RUNPOD_API_KEY destroys"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        out = []
        image = req.image or self.image or DEFAULT_IMAGE
        ram = max(MIN_RAM_PER_GPU_GB, int(-(-req.host_ram_gb // 1)))
        for g in self.api.gpu_types():
            if req.interruptible:
                out += self._spot_offers(g, req, image, ram)
                continue
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

    def _spot_offers(self, g: dict[str, Any], req: Requirements, image: str, ram: int) -> list[Offer]:
        """The type's spot offers, one per cloud with a spot price, bid at that price when it is
        within the ceiling. A type without ``lowestPrice.minimumBidPrice`` has no spot capacity."""
        if not isinstance(g.get("lowestPrice"), dict) or g["lowestPrice"].get("minimumBidPrice") is None:
            return []
        out = []
        for cloud in self.cloud_types:
            bid = g.get("secureSpotPrice" if cloud == "SECURE" else "communitySpotPrice")
            if not isinstance(bid, int | float) or isinstance(bid, bool) or bid <= 0:
                continue
            if req.max_bid_per_gpu_hour is not None and bid > req.max_bid_per_gpu_hour:
                continue
            out.append(Offer(self.name, f"{g['id']}|{cloud}", g.get("displayName") or g["id"],
                             float(bid) * req.gpu_count, vram_gb=float(g.get("memoryInGb") or 0),
                             gpu_count=req.gpu_count, region=cloud.lower(),
                             extra={"gpu_type_id": g["id"], "cloud_type": cloud, "image": image,
                                    "min_ram_per_gpu_gb": ram},
                             secure=cloud == "SECURE", interruptible=True, bid_per_gpu_hour=float(bid),
                             spot_tier="spot"))  # the catalog's tier: store/preemptions.py rates
        return out

    def _rent_spot(self, offer: Offer, body: dict[str, Any], deadman: DeadMan | None = None) -> dict[str, Any]:
        """The REST body as ``PodRentInterruptableInput`` (SkyPilot's fields: ports a string, env a
        list of key/value pairs, memory and vCPUs per pod), with the offer's bid."""
        gpus = body["gpuCount"]
        pod_input: dict[str, Any] = {
            "name": body["name"], "imageName": body["imageName"], "gpuTypeId": body["gpuTypeIds"][0],
            "bidPerGpu": float(offer.bid_per_gpu_hour or offer.usd_per_hour / max(1, gpus)), "cloudType": body["cloudType"], "gpuCount": gpus,
            "containerDiskInGb": body["containerDiskInGb"], "volumeInGb": 0, "volumeMountPath": "/workspace",
            "ports": ",".join(body["ports"]), "supportPublicIp": True,
            "env": [{"key": k, "value": v} for k, v in body["env"].items()],
            "minMemoryInGb": body["minRAMPerGPU"] * gpus, "minVcpuCount": body["minVCPUPerGPU"] * gpus,
        }
        if body.get("allowedCudaVersions"):
            pod_input["allowedCudaVersions"] = body["allowedCudaVersions"]
        start = KNOWN[body["imageName"]].start if body["imageName"] in KNOWN else ""
        if start:  # PID 1 passes the preemption's SIGTERM on to the job (compute/remote.py SPOT_INIT)
            switch = self._switch(deadman)
            pod_input["dockerArgs"] = spot_init_args(f"{switch}; {start}" if switch else start)
        for rest, gql in (("networkVolumeId", "networkVolumeId"), ("volumeMountPath", "volumeMountPath")):
            if rest in body and self.volume is not None:
                pod_input[gql] = body[rest]
        if self.volume is not None and body.get("dataCenterIds"):
            pod_input["dataCenterId"] = body["dataCenterIds"][0]
        return self.api.rent_interruptable(pod_input)

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
        spot = offer.interruptible
        start = KNOWN[image].start if image in KNOWN else ""
        if not spot and start and spec.deadman is not None:  # the switch first, then the image's own start script
            body["dockerStartCmd"] = ["bash", "-c", f"{self._switch(spec.deadman)}; exec {start}"]
        try:
            pod = self._rent_spot(offer, body, spec.deadman) if spot else self.api.create_pod(body)
        except ApiError as exc:
            if (exc.status == 400 or spot) and is_no_capacity(exc.message):
                raise NoCapacity(f"RunPod has no {offer.gpu_name} ({cloud.lower()}) for this pod right now",
                                 hint="lorapod tries the next offer") from exc
            raise
        if not pod.get("id"):
            raise NoCapacity(f"RunPod did not return a pod id for {offer.gpu_name}",
                             hint="no capacity for this GPU right now; lorapod tries the next offer")
        inst = self._instance(pod, offer.usd_per_hour)
        return inst.with_(interruptible=True) if spot else inst

    def _switch(self, deadman: DeadMan | None) -> str:
        """The dead man's switch's launcher for a pod (compute/deadman.py): the watchdog's own
        recipe, the pod's id read from its RUNPOD_POD_ID at run time; "" for none."""
        if deadman is None or deadman.after_s <= 0:
            return ""
        return replace(deadman, recipe=self.api.self_destroy_recipe("")).launcher()

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
            state = "exited"  # for a spot pod: preempted (stopped by RunPod), its volume kept
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
                        gpu_name=(pod.get("gpu") or {}).get("displayName"), label=pod.get("name"),
                        interruptible=bool(pod.get("interruptible")),
                        message="stopped by RunPod: a spot pod preempted (volume kept, GPU released)"
                        if status == "EXITED" and pod.get("interruptible") else None, **kw)


def in_stock(gpu_type: dict[str, Any]) -> bool:
    """``lowestPrice.uninterruptablePrice`` is null when no on-demand GPU of the type is rentable
    (runpodctl ``internal/api/gpu.go`` reads stock the same way): the list price says nothing."""
    lowest = gpu_type.get("lowestPrice")
    return isinstance(lowest, dict) and lowest.get("uninterruptablePrice") is not None


def is_no_capacity(message: str) -> bool:
    low = message.lower()
    return any(w in low for w in ("no longer any instances available", "no instances available",
                                  "not enough free gpus", "no available"))
