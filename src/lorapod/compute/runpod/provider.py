"""RunPod as a :class:`~lorapod.compute.provider.Provider` (REST v1 pods + GraphQL prices).

Pods are created with ``"22/tcp"`` exposed and ``supportPublicIp`` so rsync works, and the job's
public key in ``PUBLIC_KEY`` (RunPod images install it for root). Inside the pod the watchdog
deletes it with the pod-scoped ``RUNPOD_API_KEY`` RunPod puts in the container's environment;
the user's own key never leaves this machine.
"""

from __future__ import annotations

from typing import Any

from lorapod.catalog.images import DEFAULTS
from lorapod.compute.httpapi import ApiError
from lorapod.compute.provider import (
    HOST_OPTIONS,
    Capability,
    Instance,
    InstanceSpec,
    Offer,
    Requirements,
    without,
)
from lorapod.compute.runpod.api import RunPodApi
from lorapod.errors import ProviderError

DEFAULT_IMAGE = DEFAULTS["runpod"]


class RunPodProvider:
    name = "runpod"
    console_url = "https://www.runpod.io/console/pods"
    #: a network volume the run mounts (compute/runpod/volume_mount.py): limits offers, adds create fields
    volume = None

    def __init__(self, api: RunPodApi | None = None, image: str = DEFAULT_IMAGE,
                 cloud_types: tuple[str, ...] = ("COMMUNITY", "SECURE")) -> None:
        self.api = api or RunPodApi()
        self.image = image
        self.cloud_types = cloud_types

    @classmethod
    def from_kwargs(cls, **kw: Any) -> RunPodProvider:
        return cls(**without(kw, *HOST_OPTIONS))

    def capabilities(self) -> list[Capability]:
        return [
            Capability("destroy", True, "DELETE /pods/{id}"),
            Capability("stop", False, "a stopped pod still bills its volume; lorapod only destroys"),
            Capability("watchdog_api", True, "pod-scoped RUNPOD_API_KEY inside the pod"),
            Capability("spot", False, "interruptible pods are not used: a preempted job would need resume"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        out = []
        for g in self.api.gpu_types():
            prices = {"SECURE": g.get("securePrice"), "COMMUNITY": g.get("communityPrice")}
            for cloud in self.cloud_types:
                price = prices.get(cloud)
                if not price or price <= 0:
                    continue
                # RunPod prices one GPU; a pod with gpuCount N bills N times that
                out.append(Offer(self.name, f"{g['id']}|{cloud}", g.get("displayName") or g["id"],
                                 float(price) * req.gpu_count, vram_gb=float(g.get("memoryInGb") or 0),
                                 gpu_count=req.gpu_count, region=cloud.lower(),
                                 extra={"gpu_type_id": g["id"], "cloud_type": cloud},
                                 secure=cloud == "SECURE"))
        return self.volume.limit(out) if self.volume is not None else out

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        gpu_type, _, cloud = offer.id.partition("|")
        body = {
            "name": spec.provider_label[:190],
            "imageName": spec.image or self.image,
            "gpuTypeIds": [gpu_type],
            "gpuCount": max(1, offer.gpu_count),
            "cloudType": cloud or "SECURE",
            "containerDiskInGb": int(spec.disk_gb),
            "volumeInGb": 0,
            "ports": ["22/tcp"],
            "supportPublicIp": True,
            "env": {"PUBLIC_KEY": spec.ssh_public_key},
        }
        if self.volume is not None:
            body.update(self.volume.create_fields())
        pod = self.api.create_pod(body)
        if not pod.get("id"):
            raise ProviderError(f"RunPod did not return a pod id for {offer.gpu_name}",
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
        return {"provider": "runpod", "instance_id": inst.id, "api_url": self.api.base_url}

    def _instance(self, pod: dict[str, Any], usd: float, created_at: float | None = None) -> Instance:
        status = pod.get("desiredStatus")
        port = (pod.get("portMappings") or {}).get("22")
        ip = pod.get("publicIp")
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
