"""RunPod's network volumes (REST v1 ``/networkvolumes``), every request and response checked
against the published OpenAPI document by :class:`~tests.fakes.base.FakeControlPlane`.

As RunPod documents them: ``POST`` takes ``{name, size, dataCenterId}`` and answers 200 with the
``NetworkVolume``; names need not be unique (a second create with the same name makes a second
volume, and a second bill); ``DELETE`` answers 204, and 404 for a volume that does not exist.

:class:`RunPodWithVolumesFake` adds them to the pod fake, with what attaching one means there:

* ``POST /pods`` with ``networkVolumeId`` must name a volume of the account and list its datacenter
  in ``dataCenterIds`` (PodCreateInput: a pod with a network volume runs where the volume is), in
  Secure Cloud ("Network volumes are only available for Pods in the Secure Cloud",
  docs.runpod.io/pods/storage/create-network-volumes); otherwise 400, nothing created. A GPU type
  not in stock in that datacenter is refused as capacity is elsewhere (the no-capacity message).
* The volume's files outlive every pod: it is a folder of the fake's own, outside the pods' work
  root (which a deleted pod loses), seen by the pod at ``volumeMountPath`` (a symbolic link there,
  since loopback pods share this machine's filesystem; the test picks a mount path under tmp).
* Per-datacenter stock answers the GraphQL ``gpuTypes`` query with
  ``lowestPrice(input: {gpuCount, dataCenterId}) { stockStatus }``, one alias per datacenter, as
  public RunPod clients ask it; ``stockStatus`` is null where the type has no machine free.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

from .base import FakeControlPlane
from .runpod_fake import GPU_TYPES, RunPodFake

NO_CAPACITY = "There are no longer any instances available with the requested specifications. Please refresh and try again."
#: which GPU types have a free machine in which datacenter (the rest: stockStatus null)
STOCK = {"EU-RO-1": {"NVIDIA GeForce RTX 4090": "High"},
         "US-TX-3": {"NVIDIA GeForce RTX 3090": "Low", "NVIDIA GeForce RTX 4090": "Medium", "NVIDIA A40": "High"},
         "CA-MTL-1": {"NVIDIA A40": "Low"}}
_ALIAS = re.compile(r'(\w+):\s*gpuTypes\s*\{\s*id\s+lowestPrice\(input:\s*\{gpuCount:\s*(\d+),\s*'
                    r'dataCenterId:\s*"([A-Z0-9-]+)"\}\)')


class VolumeRoutes:
    """The ``/networkvolumes`` routes, shared by the control-plane-only fake and the pod fake."""

    volumes: dict[str, dict[str, Any]]

    def volume_route(self, method: str, path: str, body: Any) -> tuple[int, Any] | None:
        if path == "/networkvolumes" and method == "GET":
            return 200, list(self.volumes.values())
        if path == "/networkvolumes" and method == "POST":
            vid = secrets.token_hex(5)
            self.volumes[vid] = {"id": vid, "name": body["name"], "size": body["size"],
                                 "dataCenterId": body["dataCenterId"]}
            self.volume_created(vid)
            return 200, dict(self.volumes[vid])
        if path.startswith("/networkvolumes/") and method == "DELETE":
            vid = path.rsplit("/", 1)[1]
            if self.volumes.pop(vid, None) is None:
                return 404, {"error": "network volume not found", "_undocumented": True}
            return 204, None
        return None

    def volume_created(self, vid: str) -> None:
        pass


class RunPodVolumesFake(VolumeRoutes, FakeControlPlane):
    contract = "runpod-rest-v1.openapi.json"
    server_url = "https://rest.runpod.io/v1"

    def __init__(self, work_root, account_key: str | None = None) -> None:
        super().__init__(None, work_root, account_key)
        self.volumes: dict[str, dict[str, Any]] = {}

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if auth != self.account_key:
            return 401, {"error": "Unauthorized"}
        return self.volume_route(method, path, body) or (404, {"error": f"no route {method} {path}",
                                                               "_undocumented": True})


class RunPodWithVolumesFake(VolumeRoutes, RunPodFake):
    """Pods and network volumes; ``volume_root`` holds each volume's files, ``pod_bodies`` every
    ``POST /pods`` body as sent."""

    def __init__(self, sshd_factory, work_root: Path, volume_root: Path, *a: Any,
                 stock: dict[str, dict[str, str]] | None = None, **kw: Any) -> None:
        super().__init__(sshd_factory, work_root, *a, **kw)
        self.volumes: dict[str, dict[str, Any]] = {}
        self.volume_root = volume_root
        self.stock = STOCK if stock is None else stock
        self.pod_bodies: list[dict[str, Any]] = []

    def volume_created(self, vid: str) -> None:
        (self.volume_root / vid).mkdir(parents=True)

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if path == "/graphql" and method == "POST" and "dataCenterId" in str((body or {}).get("query")):
            if auth != self.account_key:
                return 401, {"errors": [{"message": "Unauthorized"}]}
            return 200, {"data": self._stock(str(body["query"]))}
        if path.startswith("/networkvolumes"):
            if auth != self.account_key:
                return 401, {"error": "Unauthorized"}
            return self.volume_route(method, path, body) or (404, {"error": "no route", "_undocumented": True})
        if path == "/pods" and method == "POST" and auth == self.account_key:
            self.pod_bodies.append(dict(body))
            if body.get("networkVolumeId"):
                refused = self._attach(body)
                if refused is not None:
                    return refused
        return super().route(method, path, body, query, auth)

    def _stock(self, query: str) -> dict[str, Any]:
        out = {}
        for alias, _count, dc in _ALIAS.findall(query):
            here = self.stock.get(dc, {})
            out[alias] = [{"id": g["id"], "lowestPrice": {"stockStatus": here.get(g["id"]),
                                                          "uninterruptablePrice": g["securePrice"] if g["id"] in here
                                                          else None}} for g in GPU_TYPES]
        return out

    def _attach(self, body: dict[str, Any]) -> tuple[int, Any] | None:
        vol = self.volumes.get(body["networkVolumeId"])
        if vol is None:
            return 400, {"error": f"network volume {body['networkVolumeId']} not found"}
        if vol["dataCenterId"] not in (body.get("dataCenterIds") or []):
            return 400, {"error": f"network volume is in {vol['dataCenterId']}; the pod must be created there"}
        if body.get("cloudType", "SECURE") != "SECURE":
            return 400, {"error": "network volumes are only available in Secure Cloud"}
        if body["gpuTypeIds"][0] not in self.stock.get(vol["dataCenterId"], {}):
            return 400, {"error": NO_CAPACITY}
        mount = Path(body.get("volumeMountPath") or "/workspace")
        if mount.exists() and not mount.is_symlink():
            return 400, {"error": f"the fake cannot mount over {mount} (a real folder)"}
        if mount.is_symlink():
            mount.unlink()
        mount.parent.mkdir(parents=True, exist_ok=True)
        mount.symlink_to(self.volume_root / vol["id"], target_is_directory=True)
        return None
