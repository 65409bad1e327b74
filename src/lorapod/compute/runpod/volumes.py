"""RunPod network volumes (REST v1 ``/networkvolumes``): storage that outlives a pod.

Contract: ``tests/contracts/runpod-rest-v1.openapi.json`` (ListNetworkVolumes, CreateNetworkVolume
``NetworkVolumeCreateInput {name, size, dataCenterId}`` -> ``NetworkVolume {id, name, size,
dataCenterId}``, DeleteNetworkVolume -> 204). A volume lives in one datacenter: a pod that mounts
it (``PodCreateInput.networkVolumeId``) must run there (``dataCenterIds``). It bills
$0.07/GB-month always, attached or not (catalog/data/storage.yaml, RunPod's pricing page).

Create and delete are never retried blindly, the rule instances follow: a create whose answer was
lost may have made a volume (look it up by name before trying again), and a delete is sent once
and reported, so nothing bills unseen and nothing is deleted twice by mistake.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from typing import Any

from lorapod.catalog.prices import runpod_volume_usd_per_gb_month as usd_per_gb_month
from lorapod.compute.httpapi import ApiError
from lorapod.compute.runpod.api import RunPodApi
from lorapod.errors import LorapodError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_GB = 4000  # NetworkVolumeCreateInput.size maximum




@dataclass(frozen=True)
class Volume:
    id: str
    name: str
    size_gb: int
    datacenter: str

    @property
    def usd_per_month(self) -> float:
        return round(self.size_gb * usd_per_gb_month(), 2)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": "runpod", "id": self.id, "name": self.name, "size_gb": self.size_gb,
                "datacenter": self.datacenter, "usd_per_month": self.usd_per_month}


def _volume(raw: Any) -> Volume:
    """One NetworkVolume as RunPod sent it, bounded and checked (the control plane is trusted, but
    a malformed answer is an error that names it, not a crash)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not isinstance(raw.get("size"), int):
        raise LorapodError(f"RunPod sent a network volume lorapod cannot read: {str(raw)[:200]}",
                           hint="check https://www.runpod.io/console/user/storage")
    return Volume(raw["id"][:64], str(raw.get("name") or "")[:191], int(raw["size"]), str(raw.get("dataCenterId") or "")[:32])


class NetworkVolumes:
    def __init__(self, api: RunPodApi | None = None) -> None:
        self.api = api or RunPodApi()

    def list(self) -> builtins.list[Volume]:
        """``GET /networkvolumes`` (ListNetworkVolumes)."""
        return [_volume(v) for v in (self.api.request("GET", "/networkvolumes").json() or [])]

    def find(self, name: str) -> builtins.list[Volume]:
        return [v for v in self.list() if v.name == name]

    def create(self, name: str, size_gb: int, datacenter: str) -> Volume:
        """``POST /networkvolumes`` once. An answer that never came raises with ``uncertain``: list
        by name (``lorapod volumes``) before trying again."""
        if not _NAME.match(name):
            raise LorapodError(f"volume name {name!r}", hint="letters, digits, '-', '_', '.'; at most 64")
        if not 1 <= size_gb <= MAX_GB:
            raise LorapodError(f"volume size {size_gb} GB", hint=f"between 1 and {MAX_GB} GB (RunPod's limit)")
        body = {"name": name, "size": int(size_gb), "dataCenterId": datacenter}
        try:
            resp = self.api.request("POST", "/networkvolumes", json_body=body, ok=(200, 201), idempotent=False)
        except ApiError as exc:
            if exc.uncertain:
                raise LorapodError(f"RunPod may have created network volume {name!r} but its answer was lost",
                                   hint="run `lorapod volumes` to see it before creating another (it bills "
                                        "from creation)") from exc
            raise
        return _volume(resp.json())

    def delete(self, volume_id: str) -> bool:
        """``DELETE /networkvolumes/{id}`` once; True when RunPod confirmed (204), False when it was
        already gone (404)."""
        try:
            resp = self.api.request("DELETE", f"/networkvolumes/{volume_id}", ok=(200, 204), allow=(404,),
                                    idempotent=False)
        except ApiError as exc:
            if exc.uncertain:
                raise LorapodError(f"the delete of network volume {volume_id} got no answer",
                                   hint="run `lorapod volumes` to see whether it is still there (and billing)") from exc
            raise
        return resp.status_code != 404
