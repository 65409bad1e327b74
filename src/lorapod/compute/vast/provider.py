"""Vast.ai as a :class:`~lorapod.compute.provider.Provider`.

Offers come from ``/api/v0/bundles/``; an offer is rented with ``PUT /api/v0/asks/{id}/`` and
the job's key attached. ``onstart`` copies ``CONTAINER_ID`` and the scoped ``CONTAINER_API_KEY``
into a file only root can read (:data:`INSTANCE_ENV_FILE`, mode 0600; never the world-readable
``/etc/environment``) so the watchdog, started over SSH, can destroy the instance from inside. Vast.ai
bills storage while an instance exists in any state, so lorapod never stops, only destroys; an
``actual_status`` of exited/unknown/offline never becomes running and is treated as failed.
"""

from __future__ import annotations

from typing import Any

from lorapod.catalog.images import DEFAULTS
from lorapod.compute.provider import (
    HOST_OPTIONS,
    Capability,
    CreatedButUnusable,
    Instance,
    InstanceSpec,
    Offer,
    Requirements,
    without,
)
from lorapod.compute.vast.api import VastApi
from lorapod.errors import ProviderError

DEFAULT_IMAGE = DEFAULTS["vast"]
INSTANCE_ENV_FILE = "/root/.lorapod-instance.env"


def onstart_script(path: str = INSTANCE_ENV_FILE) -> str:
    """The instance's start command: the scoped variables into a 0600 file, readable by root only."""
    import shlex

    q = shlex.quote(path)
    return (f"umask 077 && env | grep -E '^(CONTAINER_ID|CONTAINER_API_KEY)=' > {q}.tmp && "
            f"chmod 600 {q}.tmp && mv {q}.tmp {q}")
DEAD = ("exited", "unknown", "offline")


class VastProvider:
    name = "vast"
    console_url = "https://cloud.vast.ai/instances/"

    def __init__(self, api: VastApi | None = None, image: str = DEFAULT_IMAGE, verified: bool = True) -> None:
        self.api = api or VastApi()
        self.image = image
        self.verified = verified

    @classmethod
    def from_kwargs(cls, **kw: Any) -> VastProvider:
        return cls(**without(kw, *HOST_OPTIONS))

    def capabilities(self) -> list[Capability]:
        return [
            Capability("destroy", True, "DELETE /api/v0/instances/{id}/"),
            Capability("stop", False, "Vast.ai bills storage on a stopped instance; lorapod only destroys"),
            Capability("watchdog_api", True, "CONTAINER_API_KEY inside the instance"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        query: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "num_gpus": {"eq": req.gpu_count},
            "disk_space": {"gte": req.disk_gb},
            "type": "ondemand",
            "order": [["dph_total", "asc"], ["reliability", "desc"]],
            "limit": 64,
        }
        if self.verified:
            query["verified"] = {"eq": True}
        if req.gpu:
            query["gpu_name"] = {"in": [req.gpu.replace(" ", "_"), req.gpu]}
        if req.min_vram_gb:
            query["gpu_ram"] = {"gte": req.min_vram_gb * 1000}
        if req.max_usd_per_hour is not None:
            query["dph_total"] = {"lte": req.max_usd_per_hour}
        out = []
        for o in self.api.search_offers(query):
            out.append(Offer(self.name, str(o["id"]), str(o.get("gpu_name") or "?"), float(o.get("dph_total") or 0),
                             vram_gb=float(o.get("gpu_ram") or 0) / 1024, gpu_count=int(o.get("num_gpus") or 1),
                             storage_usd_per_gb_month=o.get("storage_cost"), reliability=o.get("reliability"),
                             region=o.get("geolocation"),
                             secure=self.verified or o.get("verification") == "verified"))
        return out

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        body = {
            "image": spec.image or self.image,
            "label": spec.provider_label,
            "disk": float(spec.disk_gb),
            "runtype": "ssh_direct",
            "target_state": "running",
            "cancel_unavail": True,
            "onstart": onstart_script(),
        }
        new_id = self.api.create_instance(int(offer.id), body)
        inst = Instance(id=str(new_id), provider=self.name, state="booting", usd_per_hour=offer.usd_per_hour,
                        gpu_name=offer.gpu_name, label=body["label"])
        try:
            self.api.attach_ssh_key(new_id, spec.ssh_public_key)
        except ProviderError as exc:
            # Created but unreachable: hand the id back so the session records it and destroys it
            # with confirmation and retries (never a one-shot destroy that could lose the id).
            raise CreatedButUnusable(f"vast instance {new_id} was created but its SSH key could not be attached: "
                                     f"{exc.message}", inst, hint="lorapod destroys it and tries the next offer") from exc
        return inst

    def refresh(self, inst: Instance) -> Instance:
        data = self.api.show_instance(int(inst.id))
        if data is None:
            return inst.with_(state="gone")
        return self._instance(data, inst)

    def destroy(self, instance_id: str) -> None:
        self.api.destroy_instance(int(instance_id))

    def list_instances(self) -> list[Instance]:
        return [self._instance(d, None) for d in self.api.list_instances()]

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {"provider": "vast", "instance_id": inst.id, "api_url": self.api.base_url,
                "instance_env_file": INSTANCE_ENV_FILE}

    def _instance(self, d: dict[str, Any], prev: Instance | None) -> Instance:
        status = (d.get("actual_status") or "").lower()
        if status in DEAD:
            state = "error"
        elif status == "running" and d.get("ssh_host") and d.get("ssh_port"):
            state = "running"
        else:
            state = "booting"
        kw: dict[str, Any] = {"created_at": prev.created_at} if prev else {}
        return Instance(id=str(d["id"]), provider=self.name, state=state,
                        usd_per_hour=float(d.get("dph_total") or (prev.usd_per_hour if prev else 0.0)),
                        ssh_host=d.get("ssh_host") if state == "running" else None, ssh_port=int(d.get("ssh_port") or 22),
                        ssh_user="root", gpu_name=d.get("gpu_name"), label=d.get("label"),
                        message=d.get("status_msg"), **kw)
