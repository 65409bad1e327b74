"""A fake Vast.ai (validated against vast.openapi.yaml): offers, create, attach key, show,
destroy, list. Each instance is a real sshd whose sessions see ``CONTAINER_ID`` and a scoped
``CONTAINER_API_KEY``. The document lists paths without the trailing slash Vast's CLI sends;
both are accepted. ``GET /api/v0/instances/{id}/`` of a destroyed instance answers 404, which
the document does not list (recorded as undocumented, not a violation).
"""

from __future__ import annotations

import itertools
import re
import secrets
from typing import Any

from .base import FakeControlPlane

OFFERS = [
    {"id": 9001, "ask_contract_id": 9001, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.19,
     "reliability": 0.995, "storage_cost": 0.1, "geolocation": "Spain, ES", "rentable": True, "verification": "verified"},
    {"id": 9002, "ask_contract_id": 9002, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.35,
     "reliability": 0.998, "storage_cost": 0.15, "geolocation": "US", "rentable": True, "verification": "verified"},
]


class VastFake(FakeControlPlane):
    contract = "vast.openapi.yaml"
    server_url = "https://console.vast.ai"

    def __init__(self, *a: Any, dead_offers: tuple[int, ...] = (), **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.dead_offers = set(dead_offers)  # instances from these offers end "exited", never running
        self.scoped: dict[str, str] = {}
        self._ids = itertools.count(70001)

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        path = path.rstrip("/")
        m = re.fullmatch(r"/api/v0/instances/(\d+)", path)
        if m and method == "DELETE":
            iid = m.group(1)
            if auth != self.account_key and self.scoped.get(auth) != iid:
                return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
            inst = self.instances.get(iid)
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "Instance not found"}
            self.kill_instance(inst, "account key" if auth == self.account_key else "container key")
            return 200, {"success": True, "msg": "Instance destroyed successfully"}
        if auth != self.account_key:
            return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        if path == "/api/v0/bundles" and method == "POST":
            offers = [o for o in OFFERS if self._match(o, body or {})]
            return 200, {"offers": offers}
        m2 = re.fullmatch(r"/api/v0/asks/(\d+)", path)
        if m2 and method == "PUT":
            offer = next((o for o in OFFERS if o["id"] == int(m2.group(1))), None)
            if offer is None:
                return 404, {"success": False, "error": "invalid_args", "msg": "no_such_ask"}
            iid = str(next(self._ids))
            key = "ck-" + secrets.token_hex(12)
            self.scoped[key] = iid
            self.start_instance(iid, None, {"CONTAINER_ID": iid, "CONTAINER_API_KEY": key}, offer["dph_total"],
                                offer["gpu_name"], body.get("label", ""), never_ready=offer["id"] in self.dead_offers)
            return 200, {"success": True, "new_contract": int(iid)}
        m3 = re.fullmatch(r"/api/v0/instances/(\d+)/ssh", path)
        if m3 and method == "POST":
            inst = self.instances.get(m3.group(1))
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "no such instance"}
            inst.sshd.authorize(body["ssh_key"])
            return 200, {"success": True, "msg": "SSH key attached successfully"}
        if m and method == "GET":
            inst = self.instances.get(m.group(1))
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "no such instance", "_undocumented": True}
            return 200, {"instances": self._instance(inst)}
        if path == "/api/v1/instances" and method == "GET":
            items = [self._instance(i) for i in self.instances.values() if not i.deleted]
            return 200, {"success": True, "instances_found": len(items), "total_instances": len(items),
                         "next_token": None, "instances": items}
        return 404, {"success": False, "error": "not_found", "msg": path, "_undocumented": True}

    def _match(self, offer: dict, q: dict) -> bool:
        names = (q.get("gpu_name") or {}).get("in")
        if names and offer["gpu_name"] not in names and offer["gpu_name"].replace(" ", "_") not in names:
            return False
        cap = (q.get("dph_total") or {}).get("lte")
        return not (cap is not None and offer["dph_total"] > cap)

    def _instance(self, inst) -> dict[str, Any]:
        status = "exited" if inst.never_ready else "running" if inst.ready else "loading"
        return {"id": int(inst.id), "actual_status": status, "intended_status": "running", "label": inst.label,
                "ssh_host": "127.0.0.1", "ssh_port": inst.sshd.port,
                "dph_total": inst.usd_per_hour, "gpu_name": inst.gpu, "num_gpus": 1}
